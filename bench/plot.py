"""Plot one run: `python -m bench.plot RUN_DIR` writes RUN_DIR/plot.png.

`runlog.plot_run` draws it (a real run also writes it at its end). Four panels from metrics.jsonl
(real or simulated runs alike): reward per step, tokens/s per step, the step time split (rollout /
train / sync / reconfig), and the role map over time (ranks per role and per bucket), so a planner
move is visible where it happened. Last line: `reward_last: X`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from runlog import plot_run, read_metrics


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m bench.plot RUN_DIR   (a directory with metrics.jsonl)")
    run_dir = Path(sys.argv[1])
    rows = read_metrics(run_dir)
    out = plot_run(run_dir, rows)
    print(f"wrote {out}")
    print(f"reward_last: {rows[-1]['reward_mean']:.4f}")


if __name__ == "__main__":
    main()
