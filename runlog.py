"""Run outputs shared by real runs: config.json, metrics.jsonl, summary.json, trajectory dumps, trace.json.

The schema is DESIGN.md's "Run outputs" (the simulator writes the same fields). `RunWriter`
appends one metrics row per step and flushes it at once, so a killed run keeps every finished
step; the summary is written at the end. `trace.json` is Chrome/Perfetto's trace-event format:
one complete ("X") event per phase per rank.

A logging failure never stops training: writers log the error once and carry on.

Invariants (tests/test_runlog.py): every metrics row holds the DESIGN.md step fields; the
summary holds the DESIGN.md summary fields; trace.json loads as a trace-event list.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

METRIC_FIELDS = ("step", "time_s", "step_s", "rollout_s", "train_s", "sync_s", "reconfig_s", "tokens", "trajectories",
                 "reward_mean", "staleness_max", "migrations", "role_map", "idle_frac_rollout", "idle_frac_train")
SUMMARY_FIELDS = ("bench", "system", "mode", "steps", "tokens_per_s", "trajectories_per_s", "reward_first",
                  "reward_last", "wall_s", "dropped", "peak_rss_mb")


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

    def truncate_to_step(self, step: int) -> list[dict]:
        """Resume: drop what a killed run wrote after its checkpoint (steps > `step`); return the kept rows."""
        kept = [m for m in read_metrics(self.dir) if m["step"] <= step] if (self.dir / "metrics.jsonl").exists() else []
        (self.dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in kept))
        trajs = self.dir / "trajectories.jsonl"
        if trajs.exists():  # its "step" is the 0-based index of the step that trained it
            rows = [x for x in trajs.read_text().splitlines() if x.strip() and json.loads(x)["step"] < step]
            trajs.write_text("".join(r + "\n" for r in rows))
        return kept

    def summary(self, summary: dict) -> None:
        missing = [k for k in SUMMARY_FIELDS if k not in summary]
        assert not missing, f"summary lacks {missing}"
        self._guard("summary.json", lambda: (self.dir / "summary.json").write_text(json.dumps(summary, indent=2)))

    def span(self, name: str, tid: int | str, start_s: float, dur_s: float, **args) -> None:
        """One phase on one rank (tid), times in seconds since the run started."""
        self.trace_events.append({"name": name, "ph": "X", "pid": 0, "tid": tid, "ts": start_s * 1e6,
                                  "dur": max(dur_s, 0.0) * 1e6, "args": args})

    def trace(self) -> None:
        names = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": t, "args": {"name": str(t)}}
                 for t in sorted({e["tid"] for e in self.trace_events}, key=str)]
        data = {"traceEvents": names + self.trace_events, "displayTimeUnit": "ms"}
        self._guard("trace.json", lambda: (self.dir / "trace.json").write_text(json.dumps(data)))


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def summarize(metrics: list[dict], *, bench: str, system: str, mode: str, wall_s: float, dropped: dict,
              peak_rss_mb: float, **extra) -> dict:
    """DESIGN.md summary from the step rows; throughput over `wall_s` (the whole run)."""
    tokens = sum(m["tokens"] for m in metrics)
    trajs = sum(m["trajectories"] for m in metrics)
    n = max(len(metrics), 1)
    return {
        "bench": bench, "system": system, "mode": mode, "steps": len(metrics),
        "tokens": tokens, "trajectories": trajs,
        "tokens_per_s": tokens / max(wall_s, 1e-9), "trajectories_per_s": trajs / max(wall_s, 1e-9),
        "reward_first": metrics[0]["reward_mean"] if metrics else None,
        "reward_last": metrics[-1]["reward_mean"] if metrics else None,
        "wall_s": wall_s, "dropped": dropped, "peak_rss_mb": peak_rss_mb,
        "migrations": metrics[-1]["migrations"] if metrics else 0,  # rows carry the running total
        "idle_frac_rollout": sum(m["idle_frac_rollout"] for m in metrics) / n,
        "idle_frac_train": sum(m["idle_frac_train"] for m in metrics) / n,
        "role_map_first": metrics[0].get("role_map_desc", "") if metrics else "",
        "role_map_last": metrics[-1].get("role_map_desc", "") if metrics else "",
        **extra,
    }
