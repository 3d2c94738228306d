"""The trajectory ledger: every started trajectory is trained once or dropped with a reason.

Plain Python (no torch). The step core (`scheduler/stepcore.py`, for the real runtime and the
simulator alike) records each trajectory when it starts, when it finishes, when it is trained
and when it is dropped; `check()` asserts the DESIGN invariant at the end of a run, and
`counts()` goes into summary.json.

Invariants (tests/test_ledger.py): a trajectory is trained at most once; a dropped one has a
reason; after `close()` every started trajectory is trained or dropped; an unknown or repeated
transition raises AssertionError naming the request.
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

    def counts(self) -> dict:
        states = Counter(e.state for e in self.entries.values())
        return {
            "started": len(self.entries),
            "trained": states["trained"],
            "dropped": dict(Counter(e.reason for e in self.entries.values() if e.state == "dropped")),
        }
