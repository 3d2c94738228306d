"""Turn simulator step rows into DESIGN.md's `metrics.jsonl` rows, `summary.json` and the compare table.

Algorithm: per step, take the batch's tokens/trajectories, its rollout/train/sync times, the
rollout devices' busy device-seconds since the previous step (idle = 1 - busy / (devices x
time)), and the modelled reward; the summary divides totals by the simulated time.

Definitions: `wall_s` of a simulated run is its SIMULATED time (so tokens_per_s is comparable
with a real run's); `sim_wall_s` is what the host spent. `idle_frac_rollout` of a colocated
system is measured over its rollout phase only and `idle_frac_train` over its train phase,
since the same devices do both.

Invariants (tests/test_sim_run.py): each metrics row has every DESIGN.md field; summaries have
every DESIGN.md field and `mode == "sim"`; the table has one row per system plus the footer.
"""

from __future__ import annotations

import resource

from sim.reward import REWARD_NOTE

DROP_REASONS = ("stale", "tool_infra", "cancelled")


def metrics_rows(rows: list[dict], *, colocated: bool, tracker) -> list[dict]:
    out, prev_busy = [], 0.0
    for r in rows:
        b = r["batch"]
        rm = r["role_map"]
        busy = r["rollout_busy_dev_s"] - prev_busy
        prev_busy = r["rollout_busy_dev_s"]
        num_rollout = max(1, len(rm.rollout_ranks))
        span_r = b["rollout_s"] if colocated else r["step_s"]
        span_t = b["train_s"] if colocated else r["step_s"]
        staleness = r["step"] - b["version"]
        out.append({
            "step": r["step"],
            "time_s": r["time_s"],
            "step_s": r["step_s"],
            "rollout_s": b["rollout_s"],
            "train_s": b["train_s"],
            "sync_s": b["sync_s"],
            "reconfig_s": r["reconfig_s"],
            "tokens": sum(b["tokens"]),
            "trajectories": b["num"],
            "reward_mean": tracker.step(staleness),
            "staleness_max": staleness,
            "migrations": r["migrations"],
            "role_map": rm.summary(),
            "role_map_desc": rm.describe(),
            "idle_frac_rollout": _clamp01(1.0 - busy / (num_rollout * span_r)) if span_r > 0 else 0.0,
            "idle_frac_train": _clamp01(1.0 - b["train_s"] / span_t) if span_t > 0 else 0.0,
        })
    return out


def _clamp01(x: float) -> float:
    return min(1.0, max(0.0, x))


def summarize(metrics: list[dict], *, bench: str, system: str, sim_wall_s: float, reward_target: float) -> dict:
    total_s = metrics[-1]["time_s"]
    tokens = sum(m["tokens"] for m in metrics)
    trajs = sum(m["trajectories"] for m in metrics)
    hit = next((m["time_s"] for m in metrics if m["reward_mean"] >= reward_target), None)
    n = len(metrics)
    return {
        "bench": bench,
        "system": system,
        "mode": "sim",
        "steps": n,
        "tokens": tokens,
        "trajectories": trajs,
        "tokens_per_s": tokens / total_s,
        "trajectories_per_s": trajs / total_s,
        "reward_first": metrics[0]["reward_mean"],
        "reward_last": metrics[-1]["reward_mean"],
        "reward_target": reward_target,
        "time_to_target_s": hit,
        "wall_s": total_s,
        "sim_wall_s": sim_wall_s,
        "mean_step_s": total_s / n,
        "migrations": metrics[-1]["migrations"],
        "idle_frac_rollout": sum(m["idle_frac_rollout"] for m in metrics) / n,
        "idle_frac_train": sum(m["idle_frac_train"] for m in metrics) / n,
        "role_map_first": metrics[0]["role_map_desc"],
        "role_map_last": metrics[-1]["role_map_desc"],
        "dropped": {k: 0 for k in DROP_REASONS},
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "reward_curve": [[m["time_s"], m["reward_mean"]] for m in metrics],
        "note": REWARD_NOTE,
    }


def add_ratios(systems: dict[str, dict]) -> None:
    """vs_colocate / vs_oracle throughput ratios and reward-time speed-up vs colocate, in place."""
    base = systems.get("colocate")
    best = systems.get("oracle")
    for s in systems.values():
        s["vs_colocate"] = s["tokens_per_s"] / base["tokens_per_s"] if base else None
        s["vs_oracle"] = s["tokens_per_s"] / best["tokens_per_s"] if best else None
        t, t0 = s.get("time_to_target_s"), base.get("time_to_target_s") if base else None
        s["reward_speedup_vs_colocate"] = t0 / t if t and t0 else None


def _fmt(x, spec: str) -> str:
    return format(x, spec) if x is not None else "-".rjust(int(spec.lstrip(">").split(".")[0]))


def format_table(compare: dict) -> str:
    head = (f"{'system':<18} {'tok/s':>9} {'traj/s':>8} {'vs coloc':>8} {'vs oracle':>9} "
            f"{'t->target s':>11} {'idle roll':>9} {'idle train':>10} {'migr':>6}  final layout")
    lines = [f"bench={compare['bench']} mode={compare['mode']} " + compare.get("setup", ""), head, "-" * len(head)]
    for name, s in compare["systems"].items():
        # real runs' summaries (engine/run.py) may lack the simulator-only columns
        lines.append(
            f"{name:<18} {s['tokens_per_s']:>9.0f} {s['trajectories_per_s']:>8.3f} {_fmt(s.get('vs_colocate'), '>8.2f')} "
            f"{_fmt(s.get('vs_oracle'), '>9.2f')} {_fmt(s.get('time_to_target_s'), '>11.0f')} "
            f"{_fmt(s.get('idle_frac_rollout'), '>9.2f')} {_fmt(s.get('idle_frac_train'), '>10.2f')} "
            f"{_fmt(s.get('migrations'), '>6')}  {s.get('role_map_last', '')}"
        )
    if compare.get("note"):
        lines.append(f"note: {compare['note']}")
    return "\n".join(lines)
