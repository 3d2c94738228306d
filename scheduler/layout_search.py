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
import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

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
        self._sorted_for: Workload | None = None  # the workload whose sorted lengths are cached
        self._sorted: tuple[list[int], list[int], list[tuple[int, int]]] = ([], [], [])

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
        batch = max(1, math.ceil(d.n / sum(tp_counts.values())))
        ctx = d.reprefill + d.tokens / d.n / 2  # segments above the first start at their lower limit
        rate = 0.0
        for tp, c in tp_counts.items():
            # Sequences beyond what fits in KV memory (or max_batch) wait: they add time, not throughput.
            b = min(batch, self.max_batch, self.cm.max_batch(2 * ctx, tp))
            rate += c * b / self.cm.decode_step_s(b, ctx, tp)
        f = d.decode_frac
        num_inst = sum(tp_counts.values())
        thr = d.tokens * f / rate + d.tokens * (1 - f) / num_inst * self._prefill_per_token_s(max(tp_counts))
        if d.reprefill:
            thr += batch * self.cm.prefill_s(d.reprefill, max(tp_counts))
        return thr

    def tail_s(self, d: Demand, tp: int, batch: int, tool_s_per_token: float) -> float:
        """The bucket's longest segment: it shares its instance with the bucket's others for
        about mean/longest of its life, so a bucket mixing short and long slows its tail."""
        return self._segment_s(d.longest, d.longest / 2, tp, self._shared_batch(d, batch), d.decode_frac, tool_s_per_token)

    def path_s(self, d: Demand, tp: int, num_instances: int, tool_s_per_token: float) -> float:
        """The critical trajectory's time in this bucket (`critical_pieces`): re-prefill on arrival, then its piece."""
        if not d.path_tokens:
            return 0.0
        batch = self._shared_batch(d, max(1, math.ceil(d.n / num_instances)))
        arrive = self.cm.prefill_s(d.path_from, tp) if d.path_from else 0.0
        ctx = d.path_from + d.path_tokens / 2
        return arrive + self._segment_s(d.path_tokens, ctx, tp, batch, d.decode_frac, tool_s_per_token)

    def _shared_batch(self, d: Demand, batch: int) -> float:
        share = min(1.0, d.tokens / d.n / max(1, d.longest)) if d.n > 0 else 0.0
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
        limits = [self.buckets[a].max_tokens for a in active[:-1]]
        f, tool = wl.decode_frac, wl.tool_s_per_token
        worst: tuple[float, list[tuple[int, int]]] = (-1.0, [])
        for total, signal in top:
            enter, lo, pieces = min(signal, limits[-1], total), 0, []
            for lim in limits:
                hi = max(lo, min(lim, enter))
                pieces.append((hi - lo, lo))
                lo = hi
            pieces.append((total - enter, enter))
            path = sum((self.cm.prefill_s(at, tp) if at and n else 0.0) + self._segment_s(n, at + n / 2, tp, 1, f, tool)
                       for (n, at), tp in zip(pieces, tps))
            if path > worst[0]:
                worst = (path, pieces)
        return worst[1]

    def _sorted_sample(self, wl: Workload) -> tuple[list[int], list[int], list[tuple[int, int]]]:
        """Sorted lengths, their prefix sums, and (total, signal) of the `CRITICAL_CANDIDATES` longest when signals are known."""
        if self._sorted_for is not wl:  # sort once per workload; each call is then O(buckets log n)
            lens = sorted(wl.trajectory_tokens)
            pairs = sorted(zip(wl.trajectory_tokens, wl.signal_tokens), reverse=True) if wl.signal_tokens else []
            self._sorted_for = wl
            self._sorted = (lens, [0, *itertools.accumulate(lens)], pairs[:CRITICAL_CANDIDATES])
        return self._sorted

    def demands_on(self, wl: Workload, active: tuple[int, ...], tps: tuple[int, ...]) -> list[Demand]:
        """`demands` with the critical trajectory's piece in each bucket (`path_s`); the last
        bucket's own longest segment is what that trajectory still decodes there."""
        pieces = self.critical_pieces(wl, active, tps)
        out = [dataclasses.replace(d, path_tokens=n, path_from=at) for d, (n, at) in zip(self.demands(wl, active), pieces)]
        out[-1] = dataclasses.replace(out[-1], longest=pieces[-1][0])
        return out

    def _prefill_per_token_s(self, tp: int) -> float:
        return self.cm.prefill_s(1024, tp) / 1024  # tool outputs arrive in chunks of a few hundred to a few thousand

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

    def _table(self, d: Demand, tp: int, wl: Workload) -> tuple[list[float], Callable[[int], float]]:
        """T(k) for k = 1.. instances, cut once within 1% of the single-stream tail (more cannot
        help), and P(k), the critical trajectory's time there (computed only where asked)."""
        tool = wl.tool_s_per_token
        own = (dataclasses.replace(d, path_tokens=0, path_from=0), tp)  # T(k) is the same whatever crosses the bucket
        if own not in self._tables:
            floor = self.tail_s(d, tp, 1, tool)
            kmax = max(1, min(math.ceil(d.n), self.world_size // tp))
            times, best = [], math.inf
            for k in range(1, kmax + 1):
                best = min(best, self.bucket_s(d, {tp: k}, tool))
                times.append(best)
                if best <= floor * 1.01:
                    break
            self._tables[own] = times

        @functools.cache
        def path(k: int) -> float:
            return self.path_s(d, tp, k, tool)
        return self._tables[own], path

    @staticmethod
    def _frontier(tables: list[tuple[list[float], Callable[[int], float]]],
                  tps: tuple[int, ...]) -> list[tuple[float, int, list[int]]]:
        """(rollout time, devices, instances per bucket) for each candidate time, ascending in time
        and strictly descending in devices: the fewest instances per bucket whose own time fits,
        then the critical trajectory's path through them (it can exceed every bucket's own time)."""
        cands = sorted({v for times, _ in tables for v in times})
        floor = max(times[-1] for times, _ in tables)
        negs = [[-v for v in times] for times, _ in tables]
        points = []
        for t in cands:
            if t < floor:
                continue
            ks = [bisect.bisect_left(neg, -t) + 1 for neg in negs]
            path = sum(path_of(k) for (_, path_of), k in zip(tables, ks))
            points.append((max(t, path), sum(tp * k for tp, k in zip(tps, ks)), ks))
        out: list[tuple[float, int, list[int]]] = []
        for point in sorted(points, key=lambda p: (p[0], p[1])):
            if not out or point[1] < out[-1][1]:
                out.append(point)
        return out

    def best(self, wl: Workload, scales: Scales, *, current: RoleMap | None,
             rollout_range: tuple[int, int] | None = None) -> Choice:
        """The best layout for `wl` (module docstring, 4-5) with lo <= rollout devices <= hi."""
        lo, hi = rollout_range or (1, self.world_size - 1)
        g = self.world_size
        self._tables = {}
        best_r: dict[int, tuple[float, tuple, tuple, list[int]]] = {}
        for active, tps in self._assignments():
            demands = self.demands_on(wl, active, tps)
            if any(d.n <= 0 for d in demands):
                continue
            frontier = self._frontier([self._table(d, tp, wl) for d, tp in zip(demands, tps)], tps)
            needs = [need for _, need, _ in frontier][::-1]  # ascending devices
            for r in range(1, g):
                i = bisect.bisect_right(needs, r)
                if i == 0:
                    continue
                t, _, ks = frontier[len(frontier) - i]
                if r not in best_r or t < best_r[r][0]:
                    best_r[r] = (t, active, tps, ks)
        cur_r = len(current.rollout_ranks) if current else -1
        choices = []
        for r, (t, active, tps, ks) in best_r.items():
            if not lo <= r <= hi or g - r < self.min_train:
                continue
            roll, train, sync = t * scales.rollout, self.train_s(wl, g - r, scales), self.cm.sync_s(r, g - r)
            choices.append(Choice(pipeline_step_s(roll, train, sync, self.lookahead), roll, train, sync, r, active, tps,
                                  list(ks)))
        if not choices:
            raise ValueError(
                f"planner: no layout of {g} devices fits (rollout TP >= {self.min_tp}, trainer >= {self.min_train} "
                f"devices, {lo}..{hi} rollout devices); add devices or set "
                "check_memory=False")
        best = min(choices, key=lambda c: (c.step_s, c.num_rollout != cur_r, c.num_rollout))
        best.ks = self._fill(wl, best)
        self._tables = {}
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


def num_moved(old: RoleMap | None, new: RoleMap) -> int:
    """Ranks whose role (trainer, or which instance) differs between two maps."""
    if old is None:
        return new.world_size

    def where(rm: RoleMap, r: int):
        inst = rm.instance_of(r)
        return ("trainer",) if inst is None else (inst.bucket, inst.ranks)

    return sum(1 for r in range(new.world_size) if r >= old.world_size or where(old, r) != where(new, r))


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
