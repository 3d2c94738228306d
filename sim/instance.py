"""One simulated rollout engine instance: continuous batching as a fluid of decode iterations.

Each instance keeps a virtual iteration counter `iter_pos`. A request that joins the running
batch at `iter_pos = j` with `k` tokens to go (to the end of its turn, or to its bucket's token
limit) leaves at `j + k`; a heap of those targets gives the next boundary in O(log batch). Between
two events the batch is fixed, so the instance advances at one decode iteration per
`decode_step_s(batch, mean_context, tp)` seconds (the cost model). Prefill of new context
(prompts, tool outputs, re-prefill after a migration) and weight-sync/reconfiguration pauses are
"stall" seconds spent before decode resumes. On a CPU whose cores every rank shares, the cluster
sets `slowdown` (busy processes / cores): wall time per second of work.

Invariants (tests/sim/test_sim_engine.py): a request leaves after exactly the tokens it asked for;
the batch never exceeds `capacity` sequences, nor (once it holds one) its KV capacity in tokens; the decode-token count equals the sum over requests.
"""

from __future__ import annotations

import heapq
from collections import deque


class SimRequest:
    """Mutable play-out state of one trajectory."""

    __slots__ = (
        "spec", "batch", "turn", "left", "context", "instance_id", "version", "join_iter", "target_iter",
        "need_prefill", "admitted_at", "finished_at", "num_migrations", "instances", "gen", "decode_done", "tool_until",
        "group_id", "score_until",
    )

    def __init__(self, spec, batch: int, version: int, now: float, group_id: str):
        self.spec = spec
        self.batch = batch
        self.group_id = group_id  # its GRPO group (steps.commands.group_id): the no-signal rule reads it
        self.turn = 0
        self.left = spec.turn_tokens[0]  # decode tokens left in the current turn
        self.context = spec.prompt_tokens  # tokens in the KV cache once prefilled
        self.instance_id = -1
        self.version = version
        self.join_iter = 0.0
        self.target_iter = 0.0
        self.need_prefill = spec.prompt_tokens  # tokens to prefill when it next joins a batch
        self.admitted_at = now
        self.finished_at = -1.0
        self.num_migrations = 0
        self.instances: list[int] = []
        self.gen = 0  # bumped whenever it leaves a batch; stale heap entries are skipped
        self.decode_done = 0
        self.tool_until = 0.0  # when its current (or last) tool call returns
        self.score_until = 0.0  # when its final scoring ends (0: not scored yet)


class SimInstance:
    __slots__ = (
        "instance_id", "tp", "bucket", "bucket_limit", "capacity", "cost", "queue", "heap", "num_active",
        "ctx_offset", "iter_pos", "stall_s", "last_t", "step_s", "epoch", "busy_dev_s", "active_ids",
        "kv_capacity_tokens", "num_joins", "slowdown",
    )

    def __init__(self, *, instance_id: int, tp: int, bucket: str, bucket_limit: int | None, capacity: int, cost,
                 kv_capacity_tokens: float = float("inf")):
        self.instance_id = instance_id
        self.tp = tp
        self.bucket = bucket
        self.bucket_limit = bucket_limit
        self.capacity = capacity
        self.kv_capacity_tokens = kv_capacity_tokens
        self.cost = cost
        self.queue: deque[SimRequest] = deque()
        self.heap: list[tuple[float, int, int, SimRequest]] = []
        self.active_ids: dict[int, SimRequest] = {}  # id(req) -> req, the running batch
        self.num_active = 0
        self.ctx_offset = 0.0  # sum over active of (context at join - join_iter): ctx sum = offset + n * iter_pos
        self.iter_pos = 0.0
        self.stall_s = 0.0
        self.last_t = 0.0
        self.step_s = 0.0  # seconds per decode iteration at the current batch
        self.epoch = 0
        self.busy_dev_s = 0.0
        self.num_joins = 0
        self.slowdown = 1.0  # wall seconds per second of work: > 1 while more processes than cores are busy

    # ---- time ---------------------------------------------------------------------------
    def advance(self, now: float) -> None:
        """Move the fluid forward to `now` at the current batch and step time."""
        dt = now - self.last_t
        self.last_t = now
        if dt <= 0.0:
            return
        if self.num_active:
            self.busy_dev_s += dt * self.tp
        dt /= self.slowdown  # seconds of work done in dt of wall time
        stall = self.stall_s
        if stall:  # prefill or a pause comes first
            use = stall if stall < dt else dt
            self.stall_s = stall - use
            dt -= use
        if dt > 0.0 and self.num_active and self.step_s > 0.0:
            self.iter_pos += dt / self.step_s

    def stall(self, now: float, seconds: float) -> None:
        self.advance(now)
        self.stall_s += seconds

    # ---- batch membership ---------------------------------------------------------------
    def join(self, req: SimRequest) -> None:
        """Start decoding `req` (its prefill is charged as stall)."""
        if req.need_prefill:
            self.stall_s += self.cost.prefill_s(req.need_prefill, self.tp)
            req.need_prefill = 0
        k = req.left
        limit = self.bucket_limit
        if limit is not None and 0 < limit - req.context < k:
            # stop at the bucket's token limit so the router can demote it (MLFQ safety net)
            k = limit - req.context
        pos = self.iter_pos
        req.join_iter = pos
        req.target_iter = pos + k
        req.instance_id = self.instance_id
        if not req.instances or req.instances[-1] != self.instance_id:
            req.instances.append(self.instance_id)
        self.ctx_offset += req.context - pos
        self.num_active += 1
        self.active_ids[id(req)] = req
        self.num_joins += 1
        # join order breaks ties: id() would make the finish order depend on memory addresses
        heapq.heappush(self.heap, (req.target_iter, req.gen, self.num_joins, req))

    def leave(self, req: SimRequest) -> int:
        """Take `req` out of the batch; returns the tokens it decoded here (integer)."""
        done = int(round(min(self.iter_pos, req.target_iter) - req.join_iter))
        self.ctx_offset -= req.context - req.join_iter
        self.num_active -= 1
        del self.active_ids[id(req)]
        req.gen += 1
        req.left -= done
        req.context += done
        req.decode_done += done
        return done

    def kv_tokens(self) -> float:
        return self.ctx_offset + self.num_active * self.iter_pos

    def fill(self) -> None:
        # admit while both the sequence cap and the KV cache (tokens) allow; an empty instance
        # always takes one request so that nothing waits forever
        queue = self.queue
        while queue and self.num_active < self.capacity:
            if self.num_active and self.kv_tokens() + queue[0].context > self.kv_capacity_tokens:
                break
            self.join(queue.popleft())

    def pop_due(self) -> list[SimRequest]:
        """Requests whose target iteration has been reached, removed from the batch."""
        due = []
        heap, reached = self.heap, self.iter_pos + 1e-6
        while heap:
            target, gen, _, req = heap[0]
            if gen != req.gen:
                heapq.heappop(heap)
                continue
            if target > reached:
                break
            heapq.heappop(heap)
            due.append(req)
        for req in due:
            self.iter_pos = max(self.iter_pos, req.target_iter)
            self.leave(req)
        return due

    def evict_all(self) -> list[SimRequest]:
        """Every running and queued request (for a layout change that removes this instance)."""
        out = list(self.active_ids.values())
        for req in out:
            self.leave(req)
        out.extend(self.queue)
        self.queue.clear()
        self.heap.clear()
        return out

    def next_event_time(self, now: float) -> float | None:
        """When the next request reaches its target, at the current batch; None if idle."""
        heap = self.heap
        while heap and heap[0][1] != heap[0][3].gen:
            heapq.heappop(heap)
        n = self.num_active
        if not n:
            self.step_s = 0.0
            return None
        k = max(0.0, heap[0][0] - self.iter_pos)
        mean_ctx = (self.ctx_offset + n * self.iter_pos) / n + k / 2.0
        self.step_s = step_s = self.cost.decode_step_s(n, int(mean_ctx), self.tp)
        return now + (self.stall_s + k * step_s) * self.slowdown

    @property
    def busy(self) -> bool:
        """Decoding, or prefilling / syncing before it resumes (a CPU rank is then running)."""
        return bool(self.num_active) or self.stall_s > 0.0
