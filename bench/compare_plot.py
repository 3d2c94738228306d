"""Re-draw compare.png from a compare.json: `python -m bench.compare_plot DIR` (DIR holds compare.json).

Prints the compare table again; last line `libra_vs_colocate: R`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from runlog import format_table, plot_compare


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m bench.compare_plot DIR  (DIR/compare.json from a --compare run)")
    run_dir = Path(sys.argv[1])
    result = json.loads((run_dir / "compare.json").read_text())
    path = plot_compare(result, run_dir / "compare.png")
    print(format_table(result))
    print(f"wrote {path}")
    ratio = result["systems"].get("libra", {}).get("vs_colocate")
    print(f"libra_vs_colocate: {ratio if ratio is not None else float('nan'):.2f}")


if __name__ == "__main__":
    main()
