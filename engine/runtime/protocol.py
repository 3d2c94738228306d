"""The coordinator <-> worker protocol: one frozen dataclass per message, and rank addressing.

Messages travel as pickles through the store mailbox (`engine/runtime/control.py`); both sides dispatch
on the class with `match`. Global rank 0 is the coordinator; worker i (the index role maps use)
is global rank `to_global(i)`. The kinds inside messages are enums defined here once: `EnvOp`
(what an `EnvCall` asks of the episode) and `Tick` (what a TP instance's leader tells its
followers to do next, broadcast over the instance's group by engine/runtime/worker.py).

    coordinator -> rollout leader       Add, Export, Cancel               (point to point)
    coordinator -> worker               EnvResult                         (answers an EnvCall)
    coordinator -> every member         Train, Sync, Save, ApplyRoleMap, Stop   (COLLECTIVE: every
                                        rank it names enters the same torch.distributed call)
    worker -> coordinator               Ready, Events, Exported, ExportFailed, EnvCall,
                                        Trained, Synced, Saved

Who replies what:
    Add            -> Events (ToolReturned / Progress / Finished) as the request runs
    Export         -> Exported (its state) or ExportFailed (finished meanwhile, or being scored)
    Train          -> Trained from the first trainer rank (helpers send their gradients to the trainer ranks)
    Sync           -> Synced from each rollout instance's leader and the first trainer rank
    Save           -> Saved from the first trainer rank
    ApplyRoleMap   -> Ready from every worker
    EnvCall        -> EnvResult (close: no reply)

Invariants (tests/engine/runtime/test_control.py): every message round-trips through a real store mailbox
equal to what was sent; messages from one sender arrive in order and exactly once; global and
worker ranks convert both ways. An `EnvCall`'s op is always an `EnvOp` (a plain string is converted,
an unknown one refused).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

COORDINATOR = 0  # global rank of the coordinator
WORKER_OFFSET = 1  # worker i is global rank i + WORKER_OFFSET


def to_global(worker: int) -> int:
    """Global rank of worker `worker` (its index in role maps)."""
    return worker + WORKER_OFFSET


def to_worker(global_rank: int) -> int:
    assert global_rank >= WORKER_OFFSET, f"global rank {global_rank} is the coordinator, not a worker"
    return global_rank - WORKER_OFFSET


class EnvOp(str, enum.Enum):
    """What an `EnvCall` asks of a request's episode (a str, so it logs and compares as its value)."""

    EXECUTE = "execute"  # run one tool call -> EnvResult(ToolResult)
    SCORE = "score"  # score the final text -> EnvResult(reward)
    CLOSE = "close"  # close the episode; no reply

    def __str__(self) -> str:
        return self.value


class Tick(enum.Enum):
    """Leader -> followers of a TP instance, before each thing every rank of it must do together."""

    STEP = "step"  # one engine step: the followers replay the leader's KV ops
    MAILBOX = "mailbox"  # a collective command: each follower reads it from its own mailbox


# ---- coordinator -> rollout leader ------------------------------------------------------------
@dataclass(frozen=True)
class Add:
    """Start (or, with `state`, resume after a migration) a request on the leader's engine."""

    request_id: str
    task: Any  # envs.base.Task
    prompt_ids: list[int]  # rendered prompt ([] when resuming: the state holds the ids)
    group_id: str
    state: Any = None  # engine.rollout.api.MigrationState of an exported request


@dataclass(frozen=True)
class Export:
    """Take a request off the engine to move it elsewhere."""

    request_id: str


@dataclass(frozen=True)
class Cancel:
    request_id: str


@dataclass(frozen=True)
class EnvResult:
    """The coordinator's answer to an EnvCall: the value, or the ToolInfraError it raised."""

    call_id: int
    ok: bool
    value: Any


# ---- coordinator -> every member (collectives) ------------------------------------------------
@dataclass(frozen=True)
class Train:
    """To every trainer rank and every helper: one GRPO step on the same full batch."""

    step: int
    trajectories: list  # engine.trajectory.Trajectory
    policy_version: int
    helpers: tuple[int, ...] = ()  # workers of idle TP1 instances that compute a share of the gradient (elastic joins)


@dataclass(frozen=True)
class Sync:
    """To every worker: the trainer's weights of `policy_version` to every rollout rank."""

    policy_version: int


@dataclass(frozen=True)
class Save:
    """To every trainer rank: write the trainer state (model + optimizer) to `path`/trainer.pt."""

    path: str


@dataclass(frozen=True)
class ApplyRoleMap:
    """To every worker: rebuild groups for `role_map`; a new trainer group loads `handoff`."""

    role_map: Any  # scheduler.layout.RoleMap
    handoff: str | None


@dataclass(frozen=True)
class Stop:
    pass


# ---- worker -> coordinator ---------------------------------------------------------------------
@dataclass(frozen=True)
class Ready:
    worker: int
    role: str


@dataclass(frozen=True)
class Events:
    instance_id: int
    events: list  # engine.rollout.api.ToolReturned | Progress | Finished


@dataclass(frozen=True)
class Exported:
    request_id: str
    state: Any  # engine.rollout.api.MigrationState


@dataclass(frozen=True)
class ExportFailed:
    request_id: str
    reason: str


@dataclass(frozen=True)
class EnvCall:
    """A tool thread's env call for one of the worker's requests (episodes live in the coordinator)."""

    call_id: int  # -1 for close (no reply)
    request_id: str
    op: EnvOp
    arg: Any
    key: Any = None  # an execute's (turn, index): a repeat under the same key gets the first run's result, never a rerun

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", EnvOp(self.op))  # "execute" -> EnvOp.EXECUTE; ValueError for an unknown op


@dataclass(frozen=True)
class Trained:
    step: int
    metrics: dict


@dataclass(frozen=True)
class Synced:
    worker: int
    policy_version: int
    seconds: float


@dataclass(frozen=True)
class Saved:
    path: str
    error: str = ""  # the write failed (disk full, permissions): why


@dataclass(frozen=True)
class LogLine:
    """A worker's log line, printed by the coordinator: on a terminal its live panel would draw over a line another
    process wrote (engine/runtime/view.py), so a worker sends its lines there instead."""

    text: str  # formatted as the worker's own handler would have written it


TO_WORKER = (Add, Export, Cancel, EnvResult, Train, Sync, Save, ApplyRoleMap, Stop)
TO_COORDINATOR = (Ready, Events, Exported, ExportFailed, EnvCall, Trained, Synced, Saved, LogLine)
COLLECTIVE = (Train, Sync, Save, ApplyRoleMap, Stop)
