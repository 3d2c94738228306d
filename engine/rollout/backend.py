"""The decode backend: what the shared turn logic (`engine/rollout/turns.py`) needs of whatever runs the model.

`TurnEngine` owns the requests: tool calls, limits, events, export/migration, scoring and
trajectories. A `DecodeBackend` owns the model, its KV and the sampling. Two implement it fully:
`BatchRunner` (engine/rollout/runner.py: the torch model, a batched in-place KV cache, parked KV
between turns, per-request generators, TP op replication) and `VllmRunner`
(engine/rollout/vllm_engine.py: a vLLM engine core, its prefix cache under a per-version salt).

One engine step as the turn logic drives it, on the instance's leader:

    update_weights (when queued) -> drop (requests cancelled or exported since the last step)
    -> join(ready requests) -> end_turns -> step() -> end_turns -> end_step

`join` and `step` return `Sampled`: the new tokens of each request with their log-probs (of the
full distribution at the sampling temperature, the trainer's convention). The turn logic appends
them one at a time and decides where each turn ends; `end_turns` then names the requests that
left: those waiting on a tool keep their KV (parked), the finished ones forget it; every other
request that joined or ran keeps decoding. A TP follower (`is_leader` False) only replays: the
turn logic calls `update_weights` and `serve_step` on it, nothing else.

Invariants (tests/engine/rollout/test_rollout.py, tests/engine/rollout/test_vllm_engine.py): both backends give the
same greedy tokens for the same weights, whatever joins, parks and drops happen between them; a
request's sampling never depends on the other requests in the batch.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch


class SeqView(Protocol):
    """What a backend reads of a request joining it (engine/rollout/turns.py's sequences)."""

    @property
    def request_id(self) -> str: ...

    @property
    def ids(self) -> list[int]: ...  # the whole context so far: prompt, model and tool tokens (the turn logic appends)

    @property
    def turn_start(self) -> int: ...  # index of the current model turn's first token

    def generator(self, device: torch.device) -> torch.Generator: ...  # the request's own sampling stream


class Sampled(NamedTuple):
    request_id: str
    tokens: list[int]  # new tokens, in order (the turn logic may stop reading before the last)
    logprobs: list[float]
    finished: bool  # the backend ended the turn itself (vLLM: a stop id or max_tokens); the turn logic's limits agree


class DecodeBackend(Protocol):
    is_leader: bool  # False: a TP follower that replays its leader's ops (`serve_step`)
    rows: list[str]  # requests decoding now (joined, turn not ended), in batch order

    def join(self, seqs: list[SeqView]) -> list[Sampled]:
        """Start decoding these requests' turns over their whole context (only what is not cached is computed)."""

    def step(self) -> list[Sampled]:
        """One decode step of the running requests."""

    def end_turns(self, parked: list[str], finished: list[str]) -> None:
        """These turns ended: `parked` wait on a tool and keep their KV, `finished` forget it."""

    def drop(self, rids: list[str]) -> None:
        """Forget these requests' KV, running or parked (cancelled, exported, ended while waiting on a tool)."""

    def update_weights(self, named_tensors: dict, policy_version: int, *, recompute_kv: bool) -> list[str]:
        """Load new weights in place; returns the running requests whose turns it ended (they rejoin first)."""

    def end_step(self, *, idle: bool) -> None:
        """The leader's step is over (a TP follower's `serve_step` returns `idle`)."""

    def serve_step(self) -> bool:
        """Follower: replay the leader's ops for one step; returns whether the leader is idle."""

    @property
    def offloaded(self) -> bool: ...

    def offload(self) -> None:
        """Give the device memory to a colocated trainer (nothing in flight); `reload` undoes it."""

    def reload(self) -> None: ...

    def close(self) -> None:
        """Release what the backend started (vLLM's engine core); the engine is not used after."""
