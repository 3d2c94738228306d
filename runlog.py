"""Run outputs of real and simulated runs alike: the metrics row, the summary, the compare table and plot.

The schema is docs/design.md's "Run outputs". `MetricsRow` is one step (built by the step core,
`steps/core.py`, for both the real runtime and the simulator), `summarize` turns the
rows into the summary, `idle_fractions` is the one definition of idle time, and
`add_ratios`/`format_table`/`plot_compare` read every compare (real or simulated) the same way;
`run_story` tells a run's summary in plain words and `plot_run` draws its steps (plot.png).
`RunWriter` appends one metrics row per step and flushes it at once, so a killed run keeps every
finished step; the summary is written at the end. `trace.json` is Chrome/Perfetto's
trace-event format: one complete ("X") event per phase, rewritten whole (atomically) whenever the
coordinator flushes it. A resume truncates every output to the checkpoint's step and time.

A logging failure never stops training: writers log the error once and carry on.

Invariants (tests/test_runlog.py): every metrics row holds the docs/design.md step fields and
round-trips through JSON; the summary holds the docs/design.md summary fields; idle fractions lie in
[0, 1]; trace.json loads as a trace-event list; a failing write is reported once, not raised;
after `truncate_to_step(N, t)` no output holds a step after N or a trace event ending after t;
the story names the reward trend (and warns under 8 steps), the steps without signal, the
migrations, the layout changes and each planner conclusion once, and where plot.png is.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import resource
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

DROP_REASONS = ("stale", "tool_infra", "cancelled")  # why a started trajectory was not trained on
METRIC_FIELDS = ("step", "time_s", "step_s", "rollout_s", "train_s", "sync_s", "reconfig_s", "tokens", "trajectories",
                 "reward_mean", "staleness_max", "migrations", "role_map", "idle_frac_rollout", "idle_frac_train")
SUMMARY_FIELDS = ("bench", "system", "mode", "steps", "tokens_per_s", "trajectories_per_s", "reward_first",
                  "reward_last", "wall_s", "dropped", "peak_rss_mb")


PREDICTED_KEY = "planner/predicted_step_s"  # row extra: the planner's forecast of this step's step_s, made before it ran
LAG_KEY = "trajectories_at_lag/"  # row extra "trajectories_at_lag/K": trained trajectories whose oldest token is K versions old


def trajectory_lags(row: dict) -> list[int]:
    """Every trained trajectory's lag in a metrics row (the `LAG_KEY` counts), in ascending order."""
    counts = {int(k[len(LAG_KEY):]): int(v) for k, v in row.items() if k.startswith(LAG_KEY)}
    return [lag for lag in sorted(counts) for _ in range(counts[lag])]


@dataclass(frozen=True, kw_only=True)
class MetricsRow:
    step: int  # 1-based step number
    time_s: float  # seconds since the run started (simulated seconds in a simulation)
    step_s: float  # since the previous step ended
    rollout_s: float  # the step's batch: admission to its last finished trajectory
    train_s: float  # trainer update (0: nothing trained)
    sync_s: float  # weights to the rollout ranks
    reconfig_s: float  # role-map change paid before this step (drain, hand-off, rebuild)
    tokens: int  # trained tokens (prompt + model + tool output)
    trajectories: int  # trained trajectories
    reward_mean: float
    staleness_max: int  # policy versions between the oldest trained token and the trained policy
    migrations: int  # running total of trajectories moved between instances
    role_map: dict  # ranks per role and bucket (RoleMap.summary())
    role_map_desc: str  # RoleMap.describe()
    idle_frac_rollout: float
    idle_frac_train: float
    policy_version: int  # after this step
    extra: dict = field(default_factory=dict)  # trainer metrics etc. under slash keys ("train/loss")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return {**{k: v for k, v in d.items() if k != "extra"}, **self.extra}

    @classmethod
    def from_dict(cls, d: dict) -> MetricsRow:
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        return cls(**{k: d[k] for k in names if k in d}, extra={k: v for k, v in d.items() if k not in names})


def peak_rss_mb() -> float:
    """This process's peak resident set in MB (`peak_rss_mb` of summary.json): the simulator's whole reading,
    and the host half of the engine's `engine.devices.peak_memory_mb`."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def idle_fractions(*, step_s: float, rollout_s: float, train_s: float, sync_s: float, colocated: bool) -> tuple[float, float]:
    """(rollout idle, trainer idle) shares of a step.

    The trainer idles outside `train_s`; rollout idles for the part of the step its batch was not
    running. Colocated ranks do both, so their rollout idles while they train and sync."""
    step_s = max(step_s, 1e-9)
    train_idle = 1.0 - min(1.0, train_s / step_s)
    rollout_busy = max(0.0, step_s - train_s - sync_s) if colocated else min(rollout_s, step_s)
    return round(1.0 - rollout_busy / step_s, 4), round(train_idle, 4)


def forecast_error(rows: list[dict]) -> dict:
    """How well the planner foresaw its own steps: over the rows with a forecast (`PREDICTED_KEY`), the mean
    predicted and measured step_s and the mean of |predicted / measured - 1|; {} when no row has one."""
    pairs = [(m[PREDICTED_KEY], m["step_s"]) for m in rows if m.get(PREDICTED_KEY) and m["step_s"] > 0]
    if not pairs:
        return {}
    n = len(pairs)
    return {"planner_forecast_steps": n, "planner_predicted_step_s": sum(p for p, _ in pairs) / n,
            "planner_measured_step_s": sum(s for _, s in pairs) / n,
            "planner_forecast_error": sum(abs(p / s - 1) for p, s in pairs) / n}


def summarize(rows: list[dict], *, bench: str, system: str, mode: str, wall_s: float, dropped: dict,
              peak_rss_mb: float, reward_target: float | None = None, **extra) -> dict:
    """docs/design.md summary from the step rows; throughput over `wall_s` (the whole run; simulated seconds in sim)."""
    tokens = sum(m["tokens"] for m in rows)
    trajs = sum(m["trajectories"] for m in rows)
    n = max(len(rows), 1)
    hit = next((m["time_s"] for m in rows if reward_target is not None and m["reward_mean"] >= reward_target), None)
    return {
        "bench": bench, "system": system, "mode": mode, "steps": len(rows),
        "tokens": tokens, "trajectories": trajs,
        "tokens_per_s": tokens / max(wall_s, 1e-9), "trajectories_per_s": trajs / max(wall_s, 1e-9),
        "reward_first": rows[0]["reward_mean"] if rows else None,
        "reward_last": rows[-1]["reward_mean"] if rows else None,
        "reward_target": reward_target, "time_to_target_s": hit,
        "reward_curve": [[m["time_s"], m["reward_mean"]] for m in rows],
        "wall_s": wall_s, "mean_step_s": wall_s / n, "dropped": {**{k: 0 for k in DROP_REASONS}, **dropped},
        "peak_rss_mb": peak_rss_mb,
        "migrations": rows[-1]["migrations"] if rows else 0,  # rows carry the running total
        "staleness_max": max((m["staleness_max"] for m in rows), default=0),  # the largest lag any trained token had
        "idle_frac_rollout": sum(m["idle_frac_rollout"] for m in rows) / n,
        "idle_frac_train": sum(m["idle_frac_train"] for m in rows) / n,
        "role_map_first": rows[0].get("role_map_desc", "") if rows else "",
        "role_map_last": rows[-1].get("role_map_desc", "") if rows else "",
        **forecast_error(rows),
        **extra,
    }


def _n(count: int, word: str, plural: str = "") -> str:
    return f"{count} {word if count == 1 else plural or word + 's'}"


def run_story(summary: dict, rows: list[dict], run_dir: Path) -> list[str]:
    """The summary in plain words: what was learned, what moved, what it paid, where the plot is."""
    rewards = [r["reward_mean"] for r in rows]
    learned = "reward per step " + ", ".join(f"{x:.2f}" for x in rewards[:12]) + (" ..." if len(rewards) > 12 else "")
    if len(rewards) >= 2:
        k = max(1, len(rewards) // 3)
        a, b = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
        span = "step" if k == 1 else f"{k} steps' mean"
        learned += (f"; the last {span} {b:.2f} against the first {span} {a:.2f}" if a != b else
                    f"; it ended where it began ({a:.2f})")
        if len(rewards) < 8:  # a few groups of a few samples: one lucky group moves the mean by 0.25
            learned += f" ({_n(len(rewards), 'step')} are too few to tell learning from sampling noise)"
    silent = sum(1 for r in rows if r.get("train/stepped", 1) == 0)
    if silent:
        learned += (f"; {silent} of {_n(len(rows), 'step')} trained nothing: every group's rewards were equal, so "
                    "GRPO had no signal")
    moved = [f"C-MLFQ moved {_n(summary['migrations'], 'trajectory', 'trajectories')} to a longer bucket mid-run, "
             "re-prefilled there" if summary["migrations"] else
             "C-MLFQ moved no trajectory to a longer bucket"]
    changes = summary.get("role_map_changes", 0)
    moved.append(f"the layout changed {_n(changes, 'time')}: {summary['role_map_first']} -> {summary['role_map_last']}"
                 if changes else f"the layout stayed {summary['role_map_first']}")
    last = None
    for step, note in summary.get("planner_notes", []):
        if note != last:  # a periodic check that concludes the same says nothing new
            moved.append(f"the planner after step {step}: {note}" if step else f"the planner before step 1: {note}")
        last = note
    paid = (f"layout changes {sum(r['reconfig_s'] for r in rows):.1f} s in all; on average the rollout ranks idled "
            f"{summary['idle_frac_rollout']:.0%} of a step and the trainer {summary['idle_frac_train']:.0%}")
    return ["What happened, in plain words:", f"- learned: {learned}.", *(f"- moved: {m}." for m in moved),
            f"- paid: {paid}.", f"- plot: {run_dir / 'plot.png'} (reward, tokens/s, step split, layout per step); "
            f"the phases of every step: {run_dir / 'trace.json'} (open it in Perfetto)."]


class RunWriter:
    def __init__(self, out_dir: Path):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.trace_events: list[dict] = []
        self._failed: set[str] = set()

    def _guard(self, what: str, fn) -> None:
        try:
            fn()
        except OSError as exc:  # disk full, permissions: report once, never stop training
            if what not in self._failed:
                self._failed.add(what)
                log.error("[libra] could not write %s in %s: %s (training goes on)", what, self.dir, exc)

    def _append(self, name: str, obj: dict) -> None:
        def write():
            with open(self.dir / name, "a") as f:
                f.write(json.dumps(obj) + "\n")
        self._guard(name, write)

    def metrics(self, row: dict) -> None:
        missing = [k for k in METRIC_FIELDS if k not in row]
        assert not missing, f"metrics row lacks {missing}"
        self._append("metrics.jsonl", row)

    def trajectory(self, row: dict) -> None:
        self._append("trajectories.jsonl", row)

    def sample(self, row: dict) -> None:
        self._append("trajectories_sample.jsonl", row)

    def truncate_to_step(self, step: int, wall_s: float = float("inf")) -> list[dict]:
        """Resume: drop what a stopped run wrote after its checkpoint (steps > `step`, trace events ending after
        `wall_s`, its run time then) and keep the rest, which the resumed run continues; return the kept rows."""
        kept = [m for m in read_metrics(self.dir) if m["step"] <= step] if (self.dir / "metrics.jsonl").exists() else []
        (self.dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in kept))
        for name in ("trajectories.jsonl", "trajectories_sample.jsonl"):  # both count steps from 1, as metrics do
            path = self.dir / name
            if path.exists():
                rows = [x for x in path.read_text().splitlines() if x.strip() and json.loads(x)["step"] <= step]
                path.write_text("".join(r + "\n" for r in rows))
        trace = self.dir / "trace.json"
        if trace.exists():
            events = json.loads(trace.read_text()).get("traceEvents", [])
            self.trace_events = [e for e in events if e.get("ph") == "X" and (e["ts"] + e["dur"]) / 1e6 <= wall_s + 1e-6]
        return kept

    def summary(self, summary: dict) -> None:
        missing = [k for k in SUMMARY_FIELDS if k not in summary]
        assert not missing, f"summary lacks {missing}"
        self._guard("summary.json", lambda: (self.dir / "summary.json").write_text(json.dumps(summary, indent=2)))

    def span(self, name: str, tid: int | str, start_s: float, dur_s: float, **args) -> None:
        """One phase on one lane (tid), times in seconds since the run started."""
        self.trace_events.append({"name": name, "ph": "X", "pid": 0, "tid": tid, "ts": start_s * 1e6,
                                  "dur": max(dur_s, 0.0) * 1e6, "args": args})

    def trace(self) -> None:
        names = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": t, "args": {"name": str(t)}}
                 for t in sorted({e["tid"] for e in self.trace_events}, key=str)]
        data = {"traceEvents": names + self.trace_events, "displayTimeUnit": "ms"}

        def write():
            tmp = self.dir / ".trace.json.tmp"
            tmp.write_text(json.dumps(data))
            tmp.replace(self.dir / "trace.json")
        self._guard("trace.json", write)


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


# ---- comparisons -----------------------------------------------------------------------------
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
        lines.append(
            f"{name:<18} {s['tokens_per_s']:>9.0f} {s['trajectories_per_s']:>8.3f} {_fmt(s.get('vs_colocate'), '>8.2f')} "
            f"{_fmt(s.get('vs_oracle'), '>9.2f')} {_fmt(s.get('time_to_target_s'), '>11.0f')} "
            f"{_fmt(s.get('idle_frac_rollout'), '>9.2f')} {_fmt(s.get('idle_frac_train'), '>10.2f')} "
            f"{_fmt(s.get('migrations'), '>6')}  {s.get('role_map_last', '')}"
        )
    if compare.get("note"):
        lines.append(f"note: {compare['note']}")
    return "\n".join(lines)


def plot_compare(compare: dict, path: Path) -> Path:
    """compare.png: throughput bars (labelled with the ratio to libra), reward vs time, idle fractions."""
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
        curve = systems[n].get("reward_curve", [])
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


def plot_run(run_dir: Path, rows: list[dict] | None = None) -> Path:
    """RUN_DIR/plot.png from metrics.jsonl (or its `rows`, already read): reward, tokens/s, the step split and
    the role map per step (bench.plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir) if rows is None else rows
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
