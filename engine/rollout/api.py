"""Plain data of the rollout engine: its config, requests, events and the migration state.

`Phase` is where a request is in its turn loop, as every rollout backend tracks it (one enum,
compared by member): ready (queued to join the batch), running (decoding), tool (its calls run on
the tool pool, its KV parked), scoring (its turn loop ended; the env scores it).

Invariants (tests/engine/rollout/): every config error message names the value, the
constraint and the fix; a `MigrationState` holds everything needed to resume a request on
another instance by re-prefilling its token ids (it pickles; no tensors, no futures).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from scheduler.api import OutcomeState
from scheduler.layout import MAX_SEQS_PER_INSTANCE

BACKENDS = ("torch", "vllm")
ROLLOUT_DTYPES = ("auto", "float32", "bfloat16")


class Phase(enum.Enum):
    """A request's place in its turn loop: READY -> RUNNING -> (TOOL -> READY ...) -> SCORING."""

    READY = "ready"  # queued to join the batch (new, back from a tool, or interrupted by a weight update)
    RUNNING = "running"  # decoding in the batch
    TOOL = "tool"  # its turn ended with tool calls; they run on the tool pool, its KV is parked
    SCORING = "scoring"  # its turn loop ended; the env scores it (or closes it unscored)


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    max_new_tokens_per_turn: int = 256  # a model turn ends after this many sampled tokens
    max_turns: int = 8  # model turns per trajectory; a tool call in the last turn ends it ("max_turns")
    max_total_tokens: int = 4096  # prompt + model + tool tokens; beyond it the trajectory ends ("max_tokens")
    max_tool_tokens: int = 2048  # tokens of one tool call's output the model sees; the rest is cut, with a note saying so
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # nucleus sampling mass, in (0, 1]
    max_batch: int = MAX_SEQS_PER_INSTANCE  # most sequences decoding at once; the rest wait to join
    tool_workers: int = 16  # threads running Episode.execute / score concurrently
    tool_timeout_s: float = 120.0  # a tool call running longer is reported as status "timeout"
    seed: int = 0  # sampling seed; each request draws from its own generator seeded by (seed, request_id)
    progress_every_tokens: int = 64  # emit Progress at most once per this many tokens of a request
    dtype: str = "auto"  # rollout model dtype: auto (bfloat16 on GPU/NPU, float32 on CPU) | float32 | bfloat16
    backend: str = "torch"  # rollout engine: torch (engine/rollout/engine.py) | vllm (engine/rollout/vllm_engine.py; LIBRA_VLLM=1 bash run.sh)
    vllm_kv_cache_mb: int = 1024  # --rollout.backend vllm: the KV cache of each instance (host memory on CPU)

    def __post_init__(self):
        for name in ("max_new_tokens_per_turn", "max_turns", "max_total_tokens", "max_tool_tokens", "max_batch", "tool_workers", "progress_every_tokens",
                     "vllm_kv_cache_mb"):
            if getattr(self, name) < 1:
                raise ValueError(f"RolloutConfig.{name}={getattr(self, name)} must be >= 1; set a positive value")
        if self.temperature < 0:
            raise ValueError(f"RolloutConfig.temperature={self.temperature} must be >= 0 (0 is greedy); set a non-negative value")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"RolloutConfig.top_p={self.top_p} must be in (0, 1]; use 1.0 to disable nucleus sampling")
        if self.dtype not in ROLLOUT_DTYPES:
            raise ValueError(f"RolloutConfig.dtype={self.dtype!r} is unknown; use one of {ROLLOUT_DTYPES}")
        if self.backend not in BACKENDS:
            raise ValueError(f"RolloutConfig.backend={self.backend!r} must be one of {', '.join(BACKENDS)}; "
                             "pass --rollout.backend torch (the default) or vllm")
        if self.tool_timeout_s <= 0:
            raise ValueError(f"RolloutConfig.tool_timeout_s={self.tool_timeout_s} must be > 0; set a positive number of seconds")


@dataclass(kw_only=True)
class MigrationState:
    """A request's progress so far; the target instance re-prefills `token_ids`."""

    request_id: str
    prompt_len: int
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    turns: list[tuple[int, int]]
    tool_outcomes: list[tuple[str, str, str]]
    tool_latency_s: list[float]
    turn_start: int  # index where the current model turn started
    num_turns: int  # model turns started so far (the current one included)
    instances: list[int] = field(default_factory=list)
    # exported while its tools ran: the seconds they had run, and whether their response closes the model's turn
    # (it did not end by eos); the target re-issues the turn's calls, each of which runs once (`execute_once`)
    tool_call_s: float | None = None
    close_turn: bool = True


@dataclass
class RolloutRequest:
    request_id: str
    task: Any  # envs.base.Task
    episode: Any  # envs.base.Episode
    prompt_ids: list[int]
    group_id: str
    state: MigrationState | None = None


@dataclass(frozen=True)
class ToolReturned:
    request_id: str
    outcome: OutcomeState
    tokens_so_far: int


@dataclass(frozen=True)
class Progress:
    request_id: str
    tokens_so_far: int


@dataclass(frozen=True)
class Finished:
    request_id: str
    trajectory: Any  # engine.trajectory.Trajectory


RolloutEvent = ToolReturned | Progress | Finished
