"""The planner's model and search: predicted step time of a layout, and the best layout for a workload.

`GlobalPlanner` (scheduler/planner.py) decides *when* to re-plan; this module answers *what*:
given a `Workload` (recent trajectory lengths, tool time, training tokens) it predicts the step
time of a role map, and searches every bucket layout and rollout/training split for the best.

Algorithm:
1. Demand per active bucket (`demands`): admission is MLFQ (every request starts in the first
   active bucket), so bucket b serves the token segment between its lower and upper limit of
   every trajectory that reaches it, and each arrival re-prefills the lower limit's tokens.
2. Bucket time with k instances of TP t: max(throughput, tail), where throughput =
   S_b/k x step(B)/B with B = ceil(n_b/k) sequences per instance, at most `max_batch` (an engine
   instance's cap whatever its TP, vLLM's max_num_seqs; KV memory may cap it lower), + re-prefill
   of migrated requests, and tail = the bucket's longest segment x step(b) + its tool time, where
   b = 1 + (B - 1) x mean/longest: the tail shares its instance with the bucket's other requests
   for part of its life, which is why a dedicated high-TP long bucket pays off.
3. The critical path (`critical_pieces`): among the longest trajectories, the one whose path is
   slowest decodes on each shorter bucket until its first causal signal (its first tool return)
   or that bucket's limit, whichever comes first, then moves to the last bucket (re-prefilled
   there). Rollout time = max(every bucket's time, the sum of its pieces' times, each piece at
   its bucket's TP and shared batch). With few turns (math) the first turn is most of a long
   trajectory, so a low-TP first bucket sits on the critical path; with many (swe) it does not.
   (Taken as reaching the last bucket at once, the planner chose a TP4 first bucket for math,
   9% slower in the simulator than one TP8 bucket.)
4. For every set of active buckets and every non-decreasing TP assignment from `allowed_tp`,
   the table T_a(k) gives, for each target time T, the fewest instances per bucket whose own
   time fits; the critical path through them may exceed T, so each candidate is worth
   max(T, path). Sweeping the candidate T values gives the best rollout time f(R) for every
   rollout size R at once. Tables stop once within 1% of the single-stream tail.
5. Step time for R (`pipeline_step_s`): with L batches admitted ahead of the trainer, a batch's
   cycle is rollout + train + sync before the batch L+1 steps later may start, and L+1 batches
   share it: step = max(train + sync, (rollout + train + sync) / (L + 1)), rollout = f(R) x
   rollout_scale, train = train(G-R) x train_scale. (Modelled as max(rollout, train) + sync, the
   planner took trainers for a tail the overlap already hid: 48xA800 math ran 13% slower than
   with the split kept.) The best R in the allowed range wins (ties: the current split, then
   fewer rollout devices). Devices left over go to the slowest bucket (own time or piece of the
   path), then as TP1 to the shortest one.

Invariants (tests/test_scheduler_planner.py): every layout built validates for any G in
2..1024; MLFQ demands count every trajectory in the first bucket; the batch cap is per
instance whatever its TP; a lower decoded share shrinks the tail; the critical trajectory
decodes on the first buckets until its first signal or their limit, and a late signal keeps
low-TP instances off its path.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import numpy as np

from scheduler.api import StepStats
from scheduler.costmodel import CostModel, MemoizedCost
from scheduler.layout import Bucket, RoleMap, RolloutInstance


CRITICAL_CANDIDATES = 16  # longest trajectories weighed for the critical path (a planner search weighs each per layout)


@dataclass(frozen=True, kw_only=True)
class Workload:
    trajectory_tokens: tuple[int, ...]  # a sample of total tokens per trajectory
    num_trajectories: float  # trajectories per step
    train_tokens: float  # tokens the trainer consumes per step
    tool_s_per_token: float = 0.0  # tool wall time per generated token (tool calls scale with length)
    decode_frac: float = 1.0  # share of trajectory tokens the model decodes (the rest: prompt, tool outputs)
    # per trajectory of the sample: tokens in context when its first tool result came back (its
    # total if it called none), C-MLFQ's first causal signal; () = unknown (the signal comes at once)
    signal_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.signal_tokens and len(self.signal_tokens) != len(self.trajectory_tokens):
            raise ValueError(f"Workload: {len(self.signal_tokens)} signal_tokens for {len(self.trajectory_tokens)} "
                             "trajectories; give one per trajectory, or none")
        if not 0 < self.decode_frac <= 1:
            raise ValueError(f"Workload: decode_frac={self.decode_frac} must be in (0, 1]; it is decoded / total tokens")
        if not self.trajectory_tokens or self.num_trajectories <= 0:
            raise ValueError(f"Workload: {len(self.trajectory_tokens)} trajectory lengths and num_trajectories="
                             f"{self.num_trajectories}; give at least one finished trajectory")

    @classmethod
    def from_stats(cls, stats: Sequence[StepStats]) -> Workload:
        steps = [s for s in stats if s.trajectory_tokens]
        if not steps:
            raise ValueError(f"Workload.from_stats: none of {len(stats)} steps has trajectory_tokens; report them in StepStats")
        lengths = tuple(t for s in steps for t in s.trajectory_tokens)
        tool_s = sum(sum(s.tool_latency_s) for s in steps)
        train = sum(s.train_tokens or sum(s.trajectory_tokens) for s in steps) / len(steps)
        # Tool outputs are prefilled, not decoded: counting them as decode makes the tail look longer.
        known = [s for s in steps if len(s.decode_tokens) == len(s.trajectory_tokens)]
        decoded = sum(sum(s.decode_tokens) for s in known)
        frac = min(1.0, max(1e-3, decoded / max(1, sum(sum(s.trajectory_tokens) for s in known)))) if known else 1.0
        signals = () if any(len(s.signal_tokens) != len(s.trajectory_tokens) for s in steps) else \
            tuple(t for s in steps for t in s.signal_tokens)
        return cls(trajectory_tokens=lengths, num_trajectories=len(lengths) / len(steps), train_tokens=train,
                   tool_s_per_token=tool_s / max(1, sum(lengths)), decode_frac=frac, signal_tokens=signals)


@dataclass(frozen=True)
class Demand:
    n: float  # trajectories per step
    tokens: float  # their total tokens per step
    longest: int  # longest trajectory
    reprefill: int  # tokens re-prefilled per request migrated in (0 for the first active bucket)
    decode_frac: float = 1.0  # share of the tokens that is decoded; the rest is prefilled (tool outputs)
    path_tokens: int = 0  # tokens of the critical trajectory decoded here (`critical_pieces`)
    path_from: int = 0  # its context when it arrives here (re-prefilled unless 0)


class _Terms(NamedTuple):
    """A demand's throughput-time constants on one TP (`LayoutSearch._terms`)."""

    ctx: float  # mean context of its decode steps
    cap: int  # sequences one instance decodes at once (max_batch, or fewer where KV memory runs out)
    decoded: float  # tokens decoded per step
    prefilled: float  # tokens prefilled per step (tool outputs)
    prefill_per_token_s: float
    reprefill_s: float  # re-prefill of one request migrated in (0.0 in the first active bucket)


@dataclass
class Choice:
    step_s: float
    rollout_s: float
    train_s: float
    sync_s: float
    num_rollout: int
    active: tuple[int, ...]
    tps: tuple[int, ...]
    ks: list[int] = field(default_factory=list)


@dataclass
class Scales:
    """Measured/predicted time ratios the planner keeps (EMAs), applied to every prediction."""

    rollout: float = 1.0
    train: float = 1.0


def pipeline_step_s(rollout_s: float, train_s: float, sync_s: float, lookahead: int) -> float:
    """Step period when `lookahead` batches are admitted ahead of the trainer (module docstring, 5)."""
    return max(train_s + sync_s, (rollout_s + train_s + sync_s) / (lookahead + 1))


class LayoutSearch:
    def __init__(self, cm: CostModel, world_size: int, buckets: tuple[Bucket, ...], *, allowed_tp: tuple[int, ...],
                 max_batch: int, min_tp: int, min_train: int, lookahead: int = 1) -> None:
        if lookahead < 0:
            raise ValueError(f"LayoutSearch: lookahead={lookahead} must be >= 0 (0: synchronous)")
        self.cm, self.world_size, self.buckets, self.lookahead = MemoizedCost(cm), world_size, buckets, lookahead
        self.allowed_tp, self.max_batch = allowed_tp, max_batch  # max_batch: sequences per instance, any TP
        self.min_tp, self.min_train = min_tp, min_train
        self._tables: dict = {}  # (demand without its path piece, tp) -> T(k), valid for one search
        self._paths: dict = {}  # (that key, path piece) -> P(k), valid for one search
        self._sorted_for: Workload | None = None  # the workload whose sorted lengths are cached
        self._sorted: tuple[list[int], list[int], list[tuple[int, int]]] = ([], [], [])
        self._ppt: dict[int, float] = {}  # TP -> `_prefill_per_token_s`
        self._pieces_memo: dict[tuple[int, ...], list[list[tuple[int, int]]]] = {}  # `_candidate_pieces`
        self._piece_memo: dict[tuple[int, int, int], float] = {}  # `_piece_s`

    # ---- model -------------------------------------------------------------------------------
    def demands(self, wl: Workload, active: tuple[int, ...]) -> list[Demand]:
        """Per active bucket: the work one step sends there under MLFQ admission (module docstring, 1).
        The last bucket's own tail is the whole longest trajectory; `demands_on` puts it on its path."""
        lens, prefix, _ = self._sorted_sample(wl)
        eff = [self.buckets[a].max_tokens for a in active[:-1]]
        n = len(lens)
        cuts = [0, *(bisect.bisect_right(lens, lim) for lim in eff), n]
        scale = wl.num_trajectories / n
        out = []
        for i, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
            base = eff[i - 1] if i > 0 else 0
            top = eff[i] if i < len(eff) else None
            tokens = prefix[hi] - prefix[lo] - (hi - lo) * base + ((n - hi) * (top - base) if top is not None else 0)
            longest = lens[-1] if top is None else min(lens[-1], top) - base
            out.append(Demand(n=(n - lo) * scale, tokens=tokens * scale, longest=longest if n > lo else 0,
                              reprefill=base, decode_frac=wl.decode_frac))
        return out

    def bucket_s(self, d: Demand, tp_counts: dict[int, int], tool_s_per_token: float) -> float:
        if d.n <= 0:
            return 0.0
        batch = max(1, math.ceil(d.n / sum(tp_counts.values())))
        return max(self._thr_s(d, tp_counts), self.tail_s(d, max(tp_counts), batch, tool_s_per_token))

    def _thr_s(self, d: Demand, tp_counts: dict[int, int]) -> float:
        num_inst = sum(tp_counts.values())
        batch = max(1, math.ceil(d.n / num_inst))
        rate = 0.0
        for tp, c in tp_counts.items():
            rate += self._decode_rate(self._terms(d, tp), tp, c, batch)
        return self._thr_at(self._terms(d, max(tp_counts)), rate, num_inst, batch)

    def _terms(self, d: Demand, tp: int) -> _Terms:
        """The parts of `_thr_s` on TP `tp` that do not depend on the instance count (d.n > 0)."""
        ctx = d.reprefill + d.tokens / d.n / 2  # segments above the first start at their lower limit
        f = d.decode_frac
        return _Terms(ctx=ctx, cap=min(self.max_batch, self.cm.max_batch(2 * ctx, tp)), decoded=d.tokens * f,
                      prefilled=d.tokens * (1 - f), prefill_per_token_s=self._prefill_per_token_s(tp),
                      reprefill_s=self.cm.prefill_s(d.reprefill, tp) if d.reprefill else 0.0)

    def _decode_rate(self, t: _Terms, tp: int, num_inst: int, batch: int) -> float:
        """Sequences decoded per second by `num_inst` TP-`tp` instances, each given `batch` sequences."""
        # Sequences beyond what fits in KV memory (or max_batch) wait: they add time, not throughput.
        b = min(batch, t.cap)
        return self._rate(num_inst, b, self.cm.decode_step_s(b, t.ctx, tp))

    @staticmethod
    def _rate(num_inst, b, step_s):
        """`_decode_rate` of `num_inst` instances decoding `b` sequences each, a step per `step_s`
        (floats or, element-wise, numpy arrays: `_own_times`)."""
        return num_inst * b / step_s

    @staticmethod
    def _thr_at(t: _Terms, rate, num_inst, batch):
        """Throughput time of a bucket decoding at `rate` on `num_inst` instances (`t`: its highest
        TP's terms); floats or, element-wise, numpy arrays (`_own_times`)."""
        thr = t.decoded / rate + t.prefilled / num_inst * t.prefill_per_token_s
        if t.reprefill_s:  # segments above the first re-prefill their lower limit on arrival
            thr += batch * t.reprefill_s
        return thr

    def tail_s(self, d: Demand, tp: int, batch: int, tool_s_per_token: float) -> float:
        """The bucket's longest segment: it shares its instance with the bucket's others for
        about mean/longest of its life, so a bucket mixing short and long slows its tail."""
        return self._tail_at(d, self._share(d), tp, batch, tool_s_per_token)

    def _tail_at(self, d: Demand, share: float, tp: int, batch: int, tool_s_per_token: float) -> float:
        """`tail_s` with the demand's `_share` given."""
        return self._segment_s(d.longest, d.longest / 2, tp, self._shared_batch(share, batch), d.decode_frac,
                               tool_s_per_token)

    def path_s(self, d: Demand, tp: int, num_instances: int, tool_s_per_token: float) -> float:
        """The critical trajectory's time in this bucket (`critical_pieces`): re-prefill on arrival, then its piece."""
        if not d.path_tokens:
            return 0.0
        return self._path_on(d, self._share(d), tp, max(1, math.ceil(d.n / num_instances)), tool_s_per_token)

    def _path_on(self, d: Demand, share: float, tp: int, batch: int, tool_s_per_token: float) -> float:
        """`path_s` (d.path_tokens > 0) with the demand's `_share` and the instances' batch given."""
        arrive = self.cm.prefill_s(d.path_from, tp) if d.path_from else 0.0
        ctx = d.path_from + d.path_tokens / 2
        return arrive + self._segment_s(d.path_tokens, ctx, tp, self._shared_batch(share, batch), d.decode_frac,
                                        tool_s_per_token)

    @staticmethod
    def _share(d: Demand) -> float:
        """Mean over longest segment of the bucket: the share of its tail's life spent in a full batch."""
        return min(1.0, d.tokens / d.n / max(1, d.longest)) if d.n > 0 else 0.0

    def _shared_batch(self, share: float, batch: int) -> float:
        return 1 + (min(batch, self.max_batch) - 1) * share

    def _segment_s(self, tokens: float, ctx: float, tp: int, batch: float, f: float, tool_s_per_token: float) -> float:
        """One request's time over `tokens` of its trajectory on a TP-`tp` instance decoding `batch` sequences."""
        return tokens * (f * self.cm.decode_step_s(batch, ctx, tp) + (1 - f) * self._prefill_per_token_s(tp)
                         + tool_s_per_token)

    def critical_pieces(self, wl: Workload, active: tuple[int, ...], tps: tuple[int, ...]) -> list[tuple[int, int]]:
        """(tokens, context on arrival) per active bucket of the trajectory whose path is slowest.

        Under C-MLFQ a long trajectory reaches the last bucket at its first causal signal (its
        first tool return) or, if that comes later, when it outgrows the bucket below (the
        token-limit demotion). Until then it decodes on the shorter buckets' instances, at their
        TP. With few turns (math) the first turn holds most of a long trajectory's tokens, so the
        TP and load of the first buckets are on the critical path; with many (swe) the signal
        comes early and the last bucket holds nearly all of it. Among the 16 longest of the
        sample, the critical one has the slowest single-stream path. Signals unknown: every
        trajectory is taken to reach the last bucket at once."""
        lens, _, top = self._sorted_sample(wl)
        if len(active) == 1 or not top:
            return [(0, 0)] * (len(active) - 1) + [(lens[-1], 0)]
        worst: tuple[float, list[tuple[int, int]]] = (-1.0, [])
        for pieces in self._candidate_pieces(active):
            path = sum(self._piece_s(wl, n, at, tp) for (n, at), tp in zip(pieces, tps))
            if path > worst[0]:
                worst = (path, pieces)
        return list(worst[1])

    def _candidate_pieces(self, active: tuple[int, ...]) -> list[list[tuple[int, int]]]:
        """`critical_pieces`' (tokens, context on arrival) per active bucket of each candidate, for the
        workload `_sorted_sample` last saw (they do not depend on the TPs: kept per active set)."""
        out = self._pieces_memo.get(active)
        if out is None:
            limits = [self.buckets[a].max_tokens for a in active[:-1]]
            out = self._pieces_memo[active] = []
            for total, signal in self._sorted[2]:
                enter, lo, pieces = min(signal, limits[-1], total), 0, []
                for lim in limits:
                    hi = max(lo, min(lim, enter))
                    pieces.append((hi - lo, lo))
                    lo = hi
                pieces.append((total - enter, enter))
                out.append(pieces)
        return out

    def _piece_s(self, wl: Workload, n: int, at: int, tp: int) -> float:
        """One piece of a critical path alone on a TP-`tp` instance: re-prefill on arrival, then its
        `n` tokens (kept per piece and TP for the workload `_sorted_sample` last saw)."""
        key = (n, at, tp)
        t = self._piece_memo.get(key)
        if t is None:
            t = self._piece_memo[key] = ((self.cm.prefill_s(at, tp) if at and n else 0.0)
                                         + self._segment_s(n, at + n / 2, tp, 1, wl.decode_frac, wl.tool_s_per_token))
        return t

    def _sorted_sample(self, wl: Workload) -> tuple[list[int], list[int], list[tuple[int, int]]]:
        """Sorted lengths, their prefix sums, and (total, signal) of the `CRITICAL_CANDIDATES` longest when signals are known."""
        if self._sorted_for is not wl:  # sort once per workload; each call is then O(buckets log n)
            lens = sorted(wl.trajectory_tokens)
            # the longest (total, signal) pairs, longest first: sorted(..., reverse=True)[:CRITICAL_CANDIDATES]
            pairs = heapq.nlargest(CRITICAL_CANDIDATES, zip(wl.trajectory_tokens, wl.signal_tokens)) if wl.signal_tokens else []
            self._sorted_for = wl
            self._sorted = (lens, [0, *itertools.accumulate(lens)], pairs)
            self._pieces_memo, self._piece_memo = {}, {}
        return self._sorted

    def demands_on(self, wl: Workload, active: tuple[int, ...], tps: tuple[int, ...]) -> list[Demand]:
        """`demands` with the critical trajectory's piece in each bucket (`path_s`); the last
        bucket's own longest segment is what that trajectory still decodes there."""
        pieces = self.critical_pieces(wl, active, tps)
        out = [dataclasses.replace(d, path_tokens=n, path_from=at) for d, (n, at) in zip(self.demands(wl, active), pieces)]
        out[-1] = dataclasses.replace(out[-1], longest=pieces[-1][0])
        return out

    def _prefill_per_token_s(self, tp: int) -> float:
        s = self._ppt.get(tp)  # one value per TP for the search's lifetime (its cost model is fixed)
        if s is None:
            s = self._ppt[tp] = self.cm.prefill_s(1024, tp) / 1024  # tool outputs arrive in chunks of a few hundred to a few thousand
        return s

    def train_s(self, wl: Workload, num_trainer: int, scales: Scales) -> float:
        return self.cm.train_s(int(wl.train_tokens), num_trainer) * scales.train

    def predict(self, rm: RoleMap, wl: Workload, scales: Scales) -> tuple[float, float, float]:
        """(step_s, rollout_s, train_s) predicted for an existing role map."""
        names = [b.name for b in self.buckets]
        by_bucket: dict[int, dict[int, int]] = {}
        for inst in rm.instances:
            bi = names.index(inst.bucket) if inst.bucket in names else len(names) - 1
            counts = by_bucket.setdefault(bi, {})
            counts[inst.tp] = counts.get(inst.tp, 0) + 1
        active = tuple(sorted(by_bucket))
        tps = tuple(max(by_bucket[a]) for a in active)
        demands = self.demands_on(wl, active, tps)
        tool = wl.tool_s_per_token
        path = sum(self.path_s(d, tp, sum(by_bucket[a].values()), tool) for a, d, tp in zip(active, demands, tps))
        rollout = max(path, *(self.bucket_s(d, by_bucket[a], tool) for a, d in zip(active, demands)))
        rollout *= scales.rollout
        train = self.train_s(wl, len(rm.trainer_ranks), scales)
        sync = self.cm.sync_s(len(rm.rollout_ranks), len(rm.trainer_ranks))
        return pipeline_step_s(rollout, train, sync, self.lookahead), rollout, train

    # ---- search ------------------------------------------------------------------------------
    def _assignments(self):
        ok = [t for t in self.allowed_tp if self.cm.model.tp_divides(t)] or [1]
        tps = sorted(t for t in ok if t >= self.min_tp) or [max(ok)]
        for r in range(1, len(self.buckets) + 1):
            for active in itertools.combinations(range(len(self.buckets)), r):
                for combo in itertools.combinations_with_replacement(tps, r):
                    yield active, combo

    def _table(self, d: Demand, tp: int, wl: Workload) -> tuple[np.ndarray, Callable[[int], float]]:
        """T(k) for k = 1.. instances, cut once within 1% of the single-stream tail (more cannot
        help), and P(k), the critical trajectory's time there (computed only where asked)."""
        tool = wl.tool_s_per_token
        # T(k) is the same whatever crosses the bucket: the key is the demand without its path piece
        own = (d.n, d.tokens, d.longest, d.reprefill, d.decode_frac, tp)
        times = self._tables.get(own)
        if times is None:
            times = self._tables[own] = self._own_times(d, tp, tool)
        if not d.path_tokens:
            return times, _no_path
        path = self._paths.get((own, d.path_tokens, d.path_from))  # assignments often share the critical piece
        if path is None:
            share = self._share(d)

            @functools.cache
            def on_batch(batch: int) -> float:  # P(k) depends on k only through the batch
                return self._path_on(d, share, tp, batch, tool)

            def path(k: int) -> float:
                return on_batch(max(1, math.ceil(d.n / k)))
            self._paths[own, d.path_tokens, d.path_from] = path
        return times, path

    def _own_times(self, d: Demand, tp: int, tool_s_per_token: float) -> np.ndarray:
        """T(k) = min over j <= k of `bucket_s(d, {tp: j}, tool_s_per_token)` for k = 1.., cut once
        within 1% of the single-stream tail. Every k at once with numpy: the same float operations
        as `bucket_s`, element by element, so the same values (a 1,024-device run fills ~2,400 of
        these tables, up to 1,023 long)."""
        terms, share = self._terms(d, tp), self._share(d)
        floor = self._tail_at(d, share, tp, 1, tool_s_per_token)
        k = np.arange(1, max(1, min(math.ceil(d.n), self.world_size // tp)) + 1)
        batch = np.maximum(1.0, np.ceil(d.n / k))  # `bucket_s`'s batch per instance, for each k
        # the step time and the tail depend on k only through the batch: one model call per batch
        batches, of_k = np.unique(batch, return_inverse=True)
        steps, tails = [], []
        for x in batches.tolist():
            steps.append(self.cm.decode_step_s(min(int(x), terms.cap), terms.ctx, tp))
            tails.append(self._tail_at(d, share, tp, int(x), tool_s_per_token))
        rate = self._rate(k, np.minimum(batch, terms.cap), np.array(steps)[of_k])
        own = np.maximum(self._thr_at(terms, rate, k, batch), np.array(tails)[of_k])
        times = np.minimum.accumulate(own)
        cut = np.flatnonzero(times <= floor * 1.01)  # more instances cannot help past the first such k
        return times[:cut[0] + 1 if cut.size else len(times)]

    @staticmethod
    def _frontier(tables: list[tuple[np.ndarray, Callable[[int], float]]],
                  tps: tuple[int, ...]) -> list[tuple[float, int, list[int]]]:
        """(rollout time, devices, instances per bucket) for each candidate time, ascending in time
        and strictly descending in devices: the fewest instances per bucket whose own time fits,
        then the critical trajectory's path through them (it can exceed every bucket's own time).
        Every candidate at once with numpy (the same float operations, so the same values)."""
        floor = max(times[-1] for times, _ in tables)
        cands = np.unique(np.concatenate([times for times, _ in tables]))
        cands = cands[cands >= floor]  # no k fits a time below the floor
        ks, path, devices = [], 0, 0
        for (times, path_of), tp in zip(tables, tps):
            k = np.searchsorted(-times, -cands) + 1  # fewest instances whose T(k) <= t (times descend)
            uniq, of_cand = np.unique(k, return_inverse=True)
            path = path + np.array([path_of(x) for x in uniq.tolist()])[of_cand]  # summed over buckets in order
            devices = devices + tp * k
            ks.append(k)
        time = np.maximum(cands, path)
        # sorted by (time, devices), keep a point only if it needs fewer devices than every one before it
        order = np.lexsort((devices, time))
        fewest_before = np.minimum.accumulate(np.concatenate(([devices.max() + 1], devices[order][:-1])))
        keep = order[devices[order] < fewest_before].tolist()
        kept_ks = zip(*(k[keep].tolist() for k in ks))  # instances per bucket of each kept point
        return [(t, n, list(k)) for t, n, k in zip(time[keep].tolist(), devices[keep].tolist(), kept_ks)]

    def best(self, wl: Workload, scales: Scales, *, current: RoleMap | None,
             rollout_range: tuple[int, int] | None = None) -> Choice:
        """The best layout for `wl` (module docstring, 4-5) with lo <= rollout devices <= hi."""
        lo, hi = rollout_range or (1, self.world_size - 1)
        g = self.world_size
        self._tables, self._paths = {}, {}
        # per rollout size r: (time, active, tps, ks) of the fastest assignment (the first of equals)
        best_r: list[tuple[float, tuple, tuple, list[int]] | None] = [None] * g
        for active, tps in self._assignments():
            demands = self.demands_on(wl, active, tps)
            if any(d.n <= 0 for d in demands):
                continue
            frontier = self._frontier([self._table(d, tp, wl) for d, tp in zip(demands, tps)], tps)
            # each r takes the fastest point it can afford: point j (ascending time, descending
            # devices) serves r in [need_j, need_{j-1}), the first one up to g - 1
            # (each assignment's time is non-increasing in r, so is their running best: within a
            # point's range, once it is no faster than the best so far it is no faster for larger r)
            upto = g
            for t, need, ks in frontier:
                if need >= upto:
                    continue
                entry = (t, active, tps, ks)
                for r in range(max(1, need), upto):
                    cur = best_r[r]
                    if cur is not None and not t < cur[0]:
                        break
                    best_r[r] = entry
                upto = need
        cur_r = len(current.rollout_ranks) if current else -1
        best: tuple[tuple, Choice] | None = None  # (key, choice): least step time, then the current split, then fewer devices
        for r, entry in enumerate(best_r):
            if entry is None or not lo <= r <= hi or g - r < self.min_train:
                continue
            t, active, tps, ks = entry
            roll, train, sync = t * scales.rollout, self.train_s(wl, g - r, scales), self.cm.sync_s(r, g - r)
            step = pipeline_step_s(roll, train, sync, self.lookahead)
            key = (step, r != cur_r, r)
            if best is None or key < best[0]:
                best = (key, Choice(step, roll, train, sync, r, active, tps, list(ks)))
        if best is None:
            raise ValueError(
                f"planner: no layout of {g} devices fits (rollout TP >= {self.min_tp}, trainer >= {self.min_train} "
                f"devices, {lo}..{hi} rollout devices); add devices or set "
                "check_memory=False")
        best = best[1]
        best.ks = self._fill(wl, best)
        self._tables, self._paths = {}, {}
        return best

    def _fill(self, wl: Workload, c: Choice) -> list[int]:
        """Instances per active bucket for the chosen R: the frontier's k_a, then the leftovers."""
        demands = self.demands_on(wl, c.active, c.tps)
        ks = list(c.ks)
        left = c.num_rollout - sum(k * tp for k, tp in zip(ks, c.tps))
        assert left >= 0, f"allocation {ks} x {c.tps} exceeds {c.num_rollout} rollout devices"
        tool = wl.tool_s_per_token
        while left > 0:
            order = sorted(range(len(ks)), key=lambda i: -max(self.bucket_s(demands[i], {c.tps[i]: ks[i]}, tool),
                                                               self.path_s(demands[i], c.tps[i], ks[i], tool)))
            i = next((i for i in order if c.tps[i] <= left), None)
            if i is None:
                break
            ks[i] += 1
            left -= c.tps[i]
        return ks

    # ---- output ------------------------------------------------------------------------------
    def build(self, c: Choice, current: RoleMap | None) -> RoleMap:
        """The chosen layout as a validated role map; instances whose ranks and bucket are unchanged keep their ids."""
        g, buckets = self.world_size, self.buckets
        spec = [(buckets[a].name, tp) for a, tp, k in zip(c.active, c.tps, c.ks) for _ in range(k)]
        left = c.num_rollout - sum(tp for _, tp in spec)
        if left and self.min_tp == 1:
            spec = [(buckets[c.active[0]].name, 1)] * left + spec
        num_trainer = g - sum(tp for _, tp in spec)
        old = {(i.ranks, i.bucket): i.instance_id for i in current.instances} if current else {}
        next_id = max(old.values(), default=-1) + 1
        instances, rank = [], num_trainer
        for name, tp in spec:
            ranks = tuple(range(rank, rank + tp))
            iid = old.get((ranks, name))
            if iid is None:
                iid, next_id = next_id, next_id + 1
            instances.append(RolloutInstance(instance_id=iid, bucket=name, ranks=ranks))
            rank += tp
        version = current.version + 1 if current else 0
        return RoleMap(version=version, world_size=g, trainer_ranks=tuple(range(num_trainer)),
                       instances=tuple(instances), buckets=buckets).validate()


def _no_path(k: int) -> float:
    """P(k) of a bucket the critical trajectory does not cross."""
    return 0.0


def num_moved(old: RoleMap | None, new: RoleMap) -> int:
    """Ranks whose role (trainer, or which instance) differs between two maps."""
    if old is None:
        return new.world_size

    def roles(rm: RoleMap) -> dict[int, tuple]:
        """rank -> (bucket, ranks) of its instance (`RoleMap.instance_of`: the first that holds it)."""
        out: dict[int, tuple] = {}
        for inst in rm.instances:
            for r in inst.ranks:
                out.setdefault(r, (inst.bucket, inst.ranks))
        return out

    trainer = ("trainer",)
    was, now = roles(old), roles(new)
    return sum(1 for r in range(new.world_size)
               if r >= old.world_size or was.get(r, trainer) != now.get(r, trainer))


@dataclass(frozen=True)
class Switch:
    """What a change of role map costs the runtime, in kind (`switch_of`)."""

    moved: int  # ranks whose role (trainer, or which instance) changes
    trainer_moved: bool  # the trainer group changes: the old group saves its state, the new one loads it
    engines_gone: bool  # an instance's ranks change: its engine goes, its requests drain (tool calls) and move


def switch_of(old: RoleMap | None, new: RoleMap) -> Switch:
    """The kind of change from `old` to `new` (a bucket relabel keeps every engine and the trainer)."""
    if old is None:
        return Switch(new.world_size, True, True)
    kept = {i.ranks for i in new.instances}
    return Switch(num_moved(old, new), old.trainer_ranks != new.trainer_ranks,
                  any(i.ranks not in kept for i in old.instances))
