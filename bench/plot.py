"""Plot one run: `python -m bench.plot RUN_DIR` writes RUN_DIR/plot.png.

Four panels from metrics.jsonl (real or simulated runs alike): reward per step, tokens/s per
step, the step time split (rollout / train / sync / reconfig), and the role map over time (ranks
per role and per bucket), so a planner move is visible where it happened. Last line:
`reward_last: X`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from runlog import read_metrics


def plot_run(run_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    if not rows:
        raise ValueError(f"{run_dir}/metrics.jsonl has no steps yet; plot a run that finished at least one step")
    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(2, 2, figsize=(12, 7))
    axes[0, 0].plot(steps, [r["reward_mean"] for r in rows], marker="o")
    axes[0, 0].set_title("reward (mean per step)")
    axes[0, 1].plot(steps, [r["tokens"] / max(r["step_s"], 1e-9) for r in rows], marker="o", color="tab:green")
    axes[0, 1].set_title("tokens/s per step")
    bottom = [0.0] * len(rows)
    for key in ("rollout_s", "train_s", "sync_s", "reconfig_s"):
        vals = [r[key] for r in rows]
        axes[1, 0].bar(steps, vals, bottom=bottom, label=key)
        bottom = [b + v for b, v in zip(bottom, vals)]
    axes[1, 0].plot(steps, [r["step_s"] for r in rows], color="k", marker=".", label="step_s (wall)")
    axes[1, 0].set_title("step time split (s); phases overlap in async systems")
    axes[1, 0].legend(fontsize=7)
    keys = sorted({k for r in rows for k in r["role_map"]})
    for key in keys:
        axes[1, 1].step(steps, [r["role_map"].get(key, 0) for r in rows], where="post", label=key)
    axes[1, 1].set_title("ranks per role / bucket")
    axes[1, 1].legend(fontsize=7)
    for ax in axes.flat:
        ax.set_xlabel("step")
    fig.suptitle(str(run_dir))
    fig.tight_layout()
    out = Path(run_dir) / "plot.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m bench.plot RUN_DIR   (a directory with metrics.jsonl)")
    run_dir = Path(sys.argv[1])
    out = plot_run(run_dir)
    print(f"wrote {out}")
    print(f"reward_last: {read_metrics(run_dir)[-1]['reward_mean']:.4f}")


if __name__ == "__main__":
    main()
