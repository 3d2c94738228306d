"""compare.png: throughput bars (ratio vs libra), modelled reward vs time, idle fractions.

matplotlib (Agg) is imported inside `plot_compare`, so importing `sim` stays light.

Invariants (tests/test_sim_run.py): writes a non-empty PNG for any compare dict.
"""

from __future__ import annotations

from pathlib import Path


def plot_compare(compare: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = compare["systems"]
    names = list(systems)
    ref = systems.get("libra", next(iter(systems.values())))["tokens_per_s"]
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    ax = axes[0]
    tps = [systems[n]["tokens_per_s"] for n in names]
    bars = ax.bar(names, tps, color=["tab:red" if n == "libra" else "tab:gray" if n == "oracle" else "tab:blue" for n in names])
    for bar, v in zip(bars, tps):
        ax.text(bar.get_x() + bar.get_width() / 2, v, f"{v / ref:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_title("throughput (tokens/s), label = ratio to libra")
    ax.tick_params(axis="x", rotation=45)
    ax = axes[1]
    for n in names:
        curve = systems[n]["reward_curve"]
        ax.plot([c[0] for c in curve], [c[1] for c in curve], label=n, lw=2.5 if n == "libra" else 1.2)
    target = next(iter(systems.values())).get("reward_target")
    if target is not None:
        ax.axhline(target, ls="--", color="k", lw=0.8)
    simulated = compare.get("mode") == "sim"
    ax.set_xlabel("simulated time (s)" if simulated else "wall time (s)")
    ax.set_title("reward vs time (a MODEL in simulation)" if simulated else "reward vs time (measured)")
    ax.legend(fontsize=7)
    ax = axes[2]
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [systems[n]["idle_frac_rollout"] for n in names], width=0.4, label="rollout idle")
    ax.bar([i + 0.2 for i in x], [systems[n]["idle_frac_train"] for n in names], width=0.4, label="training idle")
    ax.set_xticks(list(x), names, rotation=45)
    ax.set_ylim(0, 1)
    ax.set_title("idle fractions")
    ax.legend(fontsize=7)
    fig.suptitle(f"{compare['bench']} ({compare['mode']}) {compare.get('setup', '')}")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
