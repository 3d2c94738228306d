"""What the step core (steps/core.py) keeps of each request in flight and each admitted step: plain records.

Invariants (tests/steps/test_stepcore.py, through the core): a step is complete once every request it admitted
is done or dropped; its `dropped` counts the reasons.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from steps.commands import Finished

__all__ = ["Request", "Step"]


@dataclass
class Request:
    request_id: str
    step: int
    group_id: str
    prompt_id: str
    task: object
    instance_id: int
    migrating: bool = False
    target: int | None = None  # where the router's last migration decision sends it
    tokens: int = 0  # its tokens so far, as its last event said


@dataclass
class Step:
    index: int
    admitted_s: float
    request_ids: list[str] = field(default_factory=list)
    prompt_ids: dict[str, str] = field(default_factory=dict)  # request -> task id (the ledger's trained order)
    done: dict[str, Finished | None] = field(default_factory=dict)  # None: dropped
    drop_reasons: dict[str, str] = field(default_factory=dict)  # request -> why it was dropped
    groups: dict[str, list[str]] = field(default_factory=dict)  # GRPO group -> its requests, in admission order
    ready_s: float | None = None
    taken: set[str] = field(default_factory=set)  # finish-order batching: groups of this step already in a batch
    admitted_version: int = 0  # the rollout's policy version when it was admitted: no token of it is older

    @property
    def dropped(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for reason in self.drop_reasons.values():
            out[reason] = out.get(reason, 0) + 1
        return out

    @property
    def complete(self) -> bool:
        return len(self.done) == len(self.request_ids)
