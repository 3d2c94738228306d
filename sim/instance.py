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

from collections import deque
from heapq import heappop, heappush

from scheduler.costmodel import MemoizedCost


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
        "kv_capacity_tokens", "num_joins", "slowdown", "_q", "_shift", "_decode_memo", "_prefill_memo",
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
        # step times by one integer key, shared by the instances of one TP: a MemoizedCost prices every context
        # of a q-token bin alike, so (context // q, batch) is the key (an exact cost model: q = 1)
        self._q = (cost.q or 1) if isinstance(cost, MemoizedCost) else 1
        self._shift = max(1, capacity).bit_length()  # the batch (<= capacity) in the key's low bits
        tables = cost.int_table if isinstance(cost, MemoizedCost) else lambda name: {}
        self._decode_memo = tables(("decode_step_s", tp, self._shift))
        self._prefill_memo = tables(("prefill_s", tp))

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
        need = req.need_prefill
        if need:
            memo, key = self._prefill_memo, int(need) // self._q
            prefill_s = memo.get(key)
            if prefill_s is None:
                if len(memo) >= MemoizedCost.MAX_ENTRIES:
                    memo.clear()
                prefill_s = memo[key] = self.cost.prefill_s(need, self.tp)
            self.stall_s += prefill_s
            req.need_prefill = 0
        k, context, iid = req.left, req.context, self.instance_id
        limit = self.bucket_limit
        if limit is not None and 0 < limit - context < k:
            # stop at the bucket's token limit so the router can demote it (MLFQ safety net)
            k = limit - context
        pos = self.iter_pos
        req.join_iter = pos
        req.target_iter = target = pos + k
        req.instance_id = iid
        visited = req.instances
        if not visited or visited[-1] != iid:
            visited.append(iid)
        self.ctx_offset += context - pos
        self.num_active += 1
        self.active_ids[id(req)] = req
        self.num_joins = joins = self.num_joins + 1
        # join order breaks ties: id() would make the finish order depend on memory addresses
        heappush(self.heap, (target, req.gen, joins, req))

    def leave(self, req: SimRequest) -> int:
        """Take `req` out of the batch; returns the tokens it decoded here (integer)."""
        pos, target, joined = self.iter_pos, req.target_iter, req.join_iter
        done = int(round((target if target < pos else pos) - joined))  # min(pos, target)
        self.ctx_offset -= req.context - joined
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
        queue, capacity, kv_capacity, join = self.queue, self.capacity, self.kv_capacity_tokens, self.join
        while queue and self.num_active < capacity:
            n = self.num_active
            if n and self.ctx_offset + n * self.iter_pos + queue[0].context > kv_capacity:  # kv_tokens() + context
                break
            join(queue.popleft())

    def pop_due(self) -> list[SimRequest]:
        """Requests whose target iteration has been reached, removed from the batch."""
        due = []
        heap, reached = self.heap, self.iter_pos + 1e-6
        while heap:
            target, gen, _, req = heap[0]
            if gen != req.gen:
                heappop(heap)
                continue
            if target > reached:
                break
            heappop(heap)
            due.append(req)
        leave = self.leave
        for req in due:
            pos, target = self.iter_pos, req.target_iter
            if target > pos:  # max(pos, target)
                self.iter_pos = target
            leave(req)
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
        while heap:
            top = heap[0]
            if top[1] == top[3].gen:
                break
            heappop(heap)
        n = self.num_active
        if not n:
            self.step_s = 0.0
            return None
        pos = self.iter_pos
        k = heap[0][0] - pos
        if not k > 0.0:  # max(0.0, k)
            k = 0.0
        ctx = int((self.ctx_offset + n * pos) / n + k / 2.0)  # the mean context over the next k iterations
        memo, key = self._decode_memo, (ctx // self._q) << self._shift | n
        step_s = memo.get(key)
        if step_s is None:
            if len(memo) >= MemoizedCost.MAX_ENTRIES:
                memo.clear()
            step_s = memo[key] = self.cost.decode_step_s(n, ctx, self.tp)
        self.step_s = step_s
        return now + (self.stall_s + k * step_s) * self.slowdown

    @property
    def busy(self) -> bool:
        """Decoding, or prefilling / syncing before it resumes (a CPU rank is then running)."""
        return bool(self.num_active) or self.stall_s > 0.0
