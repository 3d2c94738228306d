"""The trajectory ledger: every started trajectory is trained once or dropped with a reason.

Plain Python (no torch). The step core (`steps/core.py`, for the real runtime and the
simulator alike) records each trajectory when it starts, when it finishes, when it is trained
and when it is dropped; `check()` asserts the DESIGN invariant at the end of a run, and
`counts()` goes into summary.json. A checkpoint keeps `counts(before_step=N)` (the steps it
covers; what was in flight of those is lost at a stop, so it counts as cancelled) and a resumed
run's ledger starts from them (`prior`), so the summary counts the whole run.

Invariants (tests/steps/test_ledger.py): a trajectory is trained at most once; a dropped one has a
reason; after `close()` every started trajectory is trained or dropped; an unknown or repeated
transition raises AssertionError naming the request; counts carried over a resume keep
started = trained + dropped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from runlog import DROP_REASONS


@dataclass
class _Entry:
    step: int
    state: str = "running"  # running | finished | trained | dropped
    reason: str = ""


@dataclass
class Ledger:
    entries: dict[str, _Entry] = field(default_factory=dict)
    trained_order: list[str] = field(default_factory=list)  # task ids in the order they were trained
    prior: dict = field(default_factory=dict)  # counts() of the run before a resume (its checkpoint's)

    def start(self, request_id: str, step: int) -> None:
        assert request_id not in self.entries, f"{request_id} started twice"
        self.entries[request_id] = _Entry(step)

    def finish(self, request_id: str) -> None:
        e = self.entries[request_id]
        assert e.state == "running", f"{request_id} finished while {e.state}"
        e.state = "finished"

    def train(self, request_id: str, task_id: str) -> None:
        e = self.entries[request_id]
        assert e.state == "finished", f"{request_id} trained while {e.state} (trained twice?)"
        e.state = "trained"
        self.trained_order.append(task_id)

    def drop(self, request_id: str, reason: str) -> None:
        assert reason in DROP_REASONS, f"{request_id}: unknown drop reason {reason!r}"
        e = self.entries[request_id]
        assert e.state in ("running", "finished"), f"{request_id} dropped while {e.state}"
        e.state, e.reason = "dropped", reason

    def running(self) -> list[str]:
        return [rid for rid, e in self.entries.items() if e.state == "running"]

    def close(self) -> None:
        """End of run: whatever is still in flight was cancelled."""
        for rid, e in self.entries.items():
            if e.state in ("running", "finished"):
                e.state, e.reason = "dropped", "cancelled"

    def check(self) -> None:
        bad = [rid for rid, e in self.entries.items() if e.state not in ("trained", "dropped") or (e.state == "dropped" and not e.reason)]
        assert not bad, f"trajectories neither trained nor dropped with a reason: {bad[:5]}"

    def counts(self, before_step: int | None = None) -> dict:
        """Started, trained and dropped (by reason), the prior segments' included. With `before_step`, only
        the trajectories of steps before it, any still in flight counted as cancelled (a checkpoint's view)."""
        entries = [e for e in self.entries.values() if before_step is None or e.step < before_step]
        trained = sum(e.state == "trained" for e in entries)
        dropped = Counter(e.reason if e.state == "dropped" else "cancelled" for e in entries
                          if e.state == "dropped" or before_step is not None and e.state != "trained")
        dropped.update(self.prior.get("dropped", {}))
        return {
            "started": len(entries) + self.prior.get("started", 0),
            "trained": trained + self.prior.get("trained", 0),
            "dropped": dict(dropped),
        }
