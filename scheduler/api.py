"""The scheduler's contract: events in (plain values, explicit `now`), frozen decisions out.

The same router and planner objects drive the real runtime (`engine/runtime/coordinator.py`) and the
simulator (`sim/`). Neither reads a clock nor does I/O: the caller passes `now` (seconds, any
monotonic origin) with every event.

Router protocol (implemented by `scheduler/cmlfq.py` and `scheduler/routers.py`):

    router.set_layout(role_map, now) -> dict[request_id, Route]   # re-homes requests whose
                                                                   # instance disappeared
    router.admit(request_id, prompt_id, prompt_tokens, now) -> Route
    router.on_tool_return(request_id, outcome, tokens_so_far, now) -> Decision
    router.on_decode(request_id, tokens_so_far, now) -> Decision   # decode-boundary check
                                                                   # (MLFQ demotion safety net)
    router.on_finish(request_id, total_tokens, now) -> None       # also feeds the prefix tree
    router.on_cancel(request_id, now) -> None
    router.tree_json() -> str | None                               # what it learned, for a checkpoint
                                                                   # (C-MLFQ's prefix tree; None: nothing)
    router.load_tree_json(text) -> None                            # warm start from an earlier tree_json

`scheduler/routers.py`'s `BaseRouter` implements all of it (a router that learns nothing returns
None and ignores a warm start), so callers call these methods and never probe a router for extras.

Planner protocol (`scheduler/planner.py`):

    planner.on_step_end(stats: StepStats, now) -> PlanDecision | None

`OutcomeState` is the discrete tool-return state of the C-MLFQ paper: (tool, size class,
status). `envs/base.py` derives it from a `ToolResult`; the simulator samples it.

Invariants (tests/scheduler/): decisions only name instances of the current layout;
a migration only goes to a strictly longer bucket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol

from scheduler.layout import RoleMap

SizeClass = Literal["small", "medium", "large"]
Status = Literal["success", "failure", "timeout"]


class OutcomeState(NamedTuple):
    """What a tool return tells the scheduler: hashable, JSON-able as a 3-list."""

    tool: str
    size_class: str  # "small" | "medium" | "large"
    status: str  # "success" | "failure" | "timeout"


@dataclass(frozen=True)
class Route:
    instance_id: int
    bucket: str


@dataclass(frozen=True)
class Decision:
    action: Literal["stay", "migrate"]
    instance_id: int  # where the request runs after this decision
    bucket: str
    reason: str = ""  # e.g. "cmlfq p90=9.1k>4k", "demote tokens=4100>4096"

    @property
    def migrate(self) -> bool:
        return self.action == "migrate"


@dataclass(frozen=True, kw_only=True)
class StepStats:
    """What the coordinator (or simulator) measured in one training step."""

    step: int
    rollout_s: float  # wall time of the step's rollout phase (or its critical path)
    train_s: float  # wall time of the trainer update; 0 = not measured (the trainer skipped a no-signal step)
    sync_s: float = 0.0  # weight transfer
    trajectory_tokens: tuple[int, ...] = ()  # total tokens of each trajectory finished this step
    tool_latency_s: tuple[float, ...] = ()  # latency of each tool call this step
    train_tokens: int = 0  # tokens the trainer consumed
    role_map: RoleMap | None = None  # layout the step ran on
    decode_tokens: tuple[int, ...] = ()  # model-generated tokens of each finished trajectory; () = unknown
    signal_tokens: tuple[int, ...] = ()  # tokens of each when its first tool result came back (its total if none); () = unknown
    reconfig_s: float = 0.0  # measured cost of the role-map change paid before this step (0: none)
    # tokens so far of each trajectory still running at the step's end (finish-order batches: the long ones a
    # batch leaves behind); lower bounds of lengths the finished sample would otherwise miss (Workload.from_stats)
    censored_tokens: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class PlanDecision:
    role_map: RoleMap  # the new, validated layout (version already bumped)
    predicted_step_s: float  # predicted step time under the new layout
    current_step_s: float  # predicted step time under the current layout
    reconfig_s: float  # predicted cost of switching
    reason: str = ""
    details: dict = field(default_factory=dict)
    # a new design (scheduler/design.py) the step core runs from the next admission; None: unchanged
    lookahead: int | None = None
    max_staleness: int | None = None
    batch_by_finish: bool | None = None


class Router(Protocol):
    def set_layout(self, role_map: RoleMap, now: float) -> dict[str, Route]: ...

    def admit(self, request_id: str, prompt_id: str, prompt_tokens: int, now: float) -> Route: ...

    def on_tool_return(self, request_id: str, outcome: OutcomeState, tokens_so_far: int, now: float) -> Decision: ...

    def on_decode(self, request_id: str, tokens_so_far: int, now: float) -> Decision: ...

    def on_finish(self, request_id: str, total_tokens: int, now: float) -> None: ...

    def on_cancel(self, request_id: str, now: float) -> None: ...

    def tree_json(self) -> str | None: ...

    def load_tree_json(self, text: str) -> None: ...


class Planner(Protocol):
    # the step time it predicts for the next step on the layout in force (None: nothing to predict from yet);
    # each metrics row reports the forecast made before its step beside the measured step_s
    forecast_step_s: float | None

    def on_step_end(self, stats: StepStats, now: float) -> PlanDecision | None: ...

    # what its checks concluded since the last call, in plain words (a layout or design kept and why, or a move)
    def take_notes(self) -> list[str]: ...
