"""The plain data the step core speaks: its config, what the caller tells it, what it answers, a checkpoint's state.

Frozen dataclasses, no behaviour beyond validation and (de)serialisation: `CoreConfig`; the
caller's `NewRequest` and `Finished`; the core's commands `Add`, `Export`, `Cancel`, `TrainBatch`
(with the idle rollout instances that join its training, `helpers`) and `StepEnd`; `RunState`, what a checkpoint keeps of the coordinator; and `group_id`, the one
format of a GRPO group's id. `steps/core.py` is the state machine that consumes and produces
them; the real coordinator and the simulator build and read them.

Invariants (tests/steps/test_stepcore.py): a bad `CoreConfig` raises ValueError naming every
value; `RunState.from_dict(to_dict())` round-trips exactly (JSON-safe).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runlog import MetricsRow
from scheduler.api import PlanDecision, StepStats
from scheduler.layout import RoleMap


@dataclass(frozen=True, kw_only=True)
class CoreConfig:
    num_steps: int  # training steps of the run
    max_staleness: int  # a trajectory older than this many policy versions is dropped, not trained
    lookahead: int  # steps admitted ahead of the trainer (0: synchronous, e.g. colocate)
    checkpoint_every: int = 0  # steps between checkpoints (0: only at the end)
    checkpoint_every_s: float = 0.0  # and/or seconds of run time between them (0: not by time)
    checkpoint_first: bool = False  # also right after the first step this run trains (a stop then never loses it all)
    batch_by_finish: bool = False  # train the first complete GRPO groups to finish, whatever step admitted them (fully async)
    # finish-order batches: `max_staleness` bounds the trained lag too (a batch waits for a group a later one would
    # train past it: libra's designs), not only admission (`lookahead`, as AReaL bounds it: the peers)
    bound_trained_lag: bool = False
    elastic: bool = False  # idle TP1 rollout instances may join a batch's training (the planner decides who: `TrainBatch.helpers`)

    def __post_init__(self) -> None:
        if (self.num_steps < 1 or self.max_staleness < 0 or self.lookahead < 0 or self.checkpoint_every < 0
                or self.checkpoint_every_s < 0):
            raise ValueError(f"CoreConfig: num_steps={self.num_steps} must be >= 1 and max_staleness="
                             f"{self.max_staleness}, lookahead={self.lookahead}, checkpoint_every="
                             f"{self.checkpoint_every}, checkpoint_every_s={self.checkpoint_every_s} >= 0")


# ---- what the caller tells the core ---------------------------------------------------------
def group_id(step: int, prompt_index: int) -> str:
    """The GRPO group of the `prompt_index`-th prompt of step `step` (0-based): its n samples share it.

    The one format of a group id, for the real coordinator and the simulator alike."""
    return f"s{step}-p{prompt_index}"


@dataclass(frozen=True, kw_only=True)
class NewRequest:
    request_id: str
    group_id: str  # the GRPO group (n samples of one prompt in one step): `group_id(step, prompt_index)`
    prompt_id: str  # the task id: routers learn per prompt, the ledger records it when trained
    prompt_tokens: int
    task: object = None  # the caller's own payload (a Task, a TrajSpec), handed back in `Add`


@dataclass(frozen=True, kw_only=True)
class Finished:
    num_tokens: int  # prompt + model + tool-output tokens
    num_model_tokens: int  # tokens the model decoded
    tool_latency_s: tuple[float, ...] = ()  # each tool call's latency
    signal_tokens: int = 0  # tokens in context when its first tool result came back (num_tokens if none); 0 = unknown
    first_version: int | None = None  # policy version of its first model token (None: no model token)
    reward: float | None = None
    reward_reason: str = ""  # why the env gave that reward (swe "tests_failed", math "wrong"); "" if it did not say
    infra_failed: bool = False  # a tool infrastructure fault, not the model's doing
    payload: object = None  # the caller's trajectory (handed to the trainer in `TrainBatch`)


# ---- what the core tells the caller ---------------------------------------------------------
@dataclass(frozen=True)
class Add:
    request_id: str
    instance_id: int
    group_id: str
    task: object
    resumed: bool  # re-added after an export: its state (token ids so far) goes with it


@dataclass(frozen=True)
class Export:
    request_id: str
    instance_id: int  # where it runs now


@dataclass(frozen=True)
class Cancel:
    request_id: str
    instance_id: int


@dataclass(frozen=True)
class TrainBatch:
    step: int  # 0-based index of the step
    payloads: tuple  # trajectories to train on, in request order
    request_ids: tuple[str, ...]
    policy_version: int  # the version the trainer starts from
    # rollout instances (RoleMap instance ids, sorted) that compute gradients on a slice of this batch with the
    # weights they hold and hand them to the trainer ranks (`CoreConfig.elastic`); () : the trainer alone
    helpers: tuple[int, ...] = ()


@dataclass(frozen=True)
class StepEnd:
    admitted_s: float  # when the step's batch was admitted (its rollout started)
    row: MetricsRow
    stats: StepStats
    plan: PlanDecision | None  # a new layout to apply at this boundary
    checkpoint: bool  # a periodic checkpoint is due
    planner_notes: tuple[str, ...] = ()  # what the planner's checks at this step end concluded (`Planner.take_notes`)


@dataclass(frozen=True, kw_only=True)
class RunState:
    """What a checkpoint keeps of the coordinator: the step is the task position (tasks are a function of seed and step)."""

    step: int
    policy_version: int
    role_map: RoleMap
    prefix_tree: str | None = None  # C-MLFQ's tree as JSON (warm start)
    ledger: dict = field(default_factory=dict)  # Ledger.counts(before_step=step): the steps it covers
    trained_task_ids: tuple[str, ...] = ()
    wall_s: float = 0.0  # run time when step `step` ended: a resumed run's clock continues from here

    def to_dict(self) -> dict:
        return {"step": self.step, "policy_version": self.policy_version, "role_map": self.role_map.to_dict(),
                "prefix_tree": self.prefix_tree, "ledger": self.ledger, "trained_task_ids": list(self.trained_task_ids),
                "wall_s": self.wall_s}

    @classmethod
    def from_dict(cls, d: dict) -> RunState:
        return cls(step=int(d["step"]), policy_version=int(d["policy_version"]), role_map=RoleMap.from_dict(d["role_map"]),
                   prefix_tree=d.get("prefix_tree"), ledger=dict(d.get("ledger", {})),
                   trained_task_ids=tuple(d.get("trained_task_ids", ())), wall_s=float(d.get("wall_s", 0.0)))
