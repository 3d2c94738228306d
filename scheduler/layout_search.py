"""The planner's model and search: predicted step time of a layout, and the best layout for a workload.

`GlobalPlanner` (scheduler/planner.py) decides *when* to re-plan; this module answers *what*:
given a `Workload` (recent trajectory lengths, tool time, training tokens) it predicts the step
time of a role map, and searches every bucket layout and rollout/training split for the best.

Algorithm:
1. Demand per active bucket (`demands`): admission is MLFQ (every request starts in the first
   active bucket), so bucket b serves the token segment between its lower and upper limit of
   every trajectory that reaches it, and each arrival re-prefills the lower limit's tokens.
2. Bucket time with k instances of TP t: max(throughput, tail), where throughput =
   S_b/k x step(B)/B with B = ceil(n_b/k) sequences per instance (+ re-prefill of migrated
   requests), and tail = l_b x step(b) + the tool time of the longest trajectory, where
   b = 1 + (B - 1) x mean/longest: the tail shares its instance with the bucket's other requests
   for part of its life, which is why a dedicated high-TP long bucket pays off.
3. For every set of active buckets and every non-decreasing TP assignment from `allowed_tp`,
   the table T_a(k) gives, for each target time T, the devices needed sum_a t_a k_a(T);
   sweeping the candidate T values gives the best rollout time f(R) for every rollout size R at
   once (min-max allocation). Tables stop once within 1% of the single-stream tail.
4. Step time for R (`pipeline_step_s`): with L batches admitted ahead of the trainer, a batch's
   cycle is rollout + train + sync before the batch L+1 steps later may start, and L+1 batches
   share it: step = max(train + sync, (rollout + train + sync) / (L + 1)), rollout = f(R) x
   rollout_scale, train = train(G-R) x train_scale. (Modelled as max(rollout, train) + sync, the
   planner took trainers for a tail the overlap already hid: 48xA800 math ran 13% slower than
   with the split kept.) The best R in the allowed range wins (ties: the current split, then
   fewer rollout devices). Devices left over go to the slowest bucket, then as TP1 to the
   shortest one.

Invariants (tests/test_scheduler_planner.py): every layout built validates for any G in
2..1024; MLFQ demands count every trajectory in the first bucket; a per-device batch cap
limits TP1 batches; a lower decoded share shrinks the tail.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field
from typing import Sequence

from scheduler.api import StepStats
from scheduler.costmodel import CostModel
from scheduler.layout import Bucket, RoleMap, RolloutInstance


@dataclass(frozen=True, kw_only=True)
class Workload:
    trajectory_tokens: tuple[int, ...]  # a sample of total tokens per trajectory
    num_trajectories: float  # trajectories per step
    train_tokens: float  # tokens the trainer consumes per step
    tool_s_per_token: float = 0.0  # tool wall time per generated token (tool calls scale with length)
    decode_frac: float = 1.0  # share of trajectory tokens the model decodes (the rest: prompt, tool outputs)

    def __post_init__(self) -> None:
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
        return cls(trajectory_tokens=lengths, num_trajectories=len(lengths) / len(steps), train_tokens=train,
                   tool_s_per_token=tool_s / max(1, sum(lengths)), decode_frac=frac)


@dataclass(frozen=True)
class Demand:
    n: float  # trajectories per step
    tokens: float  # their total tokens per step
    longest: int  # longest trajectory
    reprefill: int  # tokens re-prefilled per request migrated in (0 for the first active bucket)
    decode_frac: float = 1.0  # share of the tokens that is decoded; the rest is prefilled (tool outputs)


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
    """Step period when `lookahead` batches are admitted ahead of the trainer (module docstring, 4)."""
    return max(train_s + sync_s, (rollout_s + train_s + sync_s) / (lookahead + 1))


class LayoutSearch:
    def __init__(self, cm: CostModel, world_size: int, buckets: tuple[Bucket, ...], *, allowed_tp: tuple[int, ...],
                 max_batch: int, max_seqs_per_device: int, min_tp: int, min_train: int, lookahead: int = 1) -> None:
        if lookahead < 0:
            raise ValueError(f"LayoutSearch: lookahead={lookahead} must be >= 0 (0: synchronous)")
        self.cm, self.world_size, self.buckets, self.lookahead = cm, world_size, buckets, lookahead
        self.allowed_tp, self.max_batch, self.max_seqs_per_device = allowed_tp, max_batch, max_seqs_per_device
        self.min_tp, self.min_train = min_tp, min_train
        self._tables: dict = {}  # (demand, tp) -> T(k), valid for one search
        self._sorted_for: Workload | None = None  # the workload whose sorted lengths are cached
        self._sorted: tuple[list[int], list[int]] = ([], [])

    # ---- model -------------------------------------------------------------------------------
    def demands(self, wl: Workload, active: tuple[int, ...]) -> list[Demand]:
        """Per active bucket: the work one step sends there under MLFQ admission (module docstring, 1).
        The last bucket's tail is the whole longest trajectory (C-MLFQ's causal signal promotes it early)."""
        if self._sorted_for is not wl:  # sort once per workload; each call is then O(buckets log n)
            lens = sorted(wl.trajectory_tokens)
            self._sorted_for, self._sorted = wl, (lens, [0, *itertools.accumulate(lens)])
        lens, prefix = self._sorted
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
            b = min(batch, self.seq_cap(tp), self.cm.max_batch(2 * ctx, tp))
            rate += c * b / self.cm.decode_step_s(b, ctx, tp)
        f = d.decode_frac
        num_inst = sum(tp_counts.values())
        thr = d.tokens * f / rate + d.tokens * (1 - f) / num_inst * self._prefill_per_token_s(max(tp_counts))
        if d.reprefill:
            thr += batch * self.cm.prefill_s(d.reprefill, max(tp_counts))
        return thr

    def tail_s(self, d: Demand, tp: int, batch: int, tool_s_per_token: float) -> float:
        """The longest trajectory's time: it shares its instance with the bucket's others for
        about mean/longest of its life, so a bucket mixing short and long slows its tail."""
        share = min(1.0, d.tokens / d.n / max(1, d.longest))
        b = 1 + (min(batch, self.seq_cap(tp)) - 1) * share
        f = d.decode_frac
        decode_s = d.longest * f * self.cm.decode_step_s(b, d.longest / 2, tp)
        return decode_s + d.longest * (1 - f) * self._prefill_per_token_s(tp) + d.longest * tool_s_per_token

    def seq_cap(self, tp: int) -> int:
        """Most sequences a TP-`tp` instance runs at once: a per-device engine cap makes TP1 batches small."""
        per_device = self.max_seqs_per_device
        return min(self.max_batch, per_device * tp) if per_device else self.max_batch

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
        demands = self.demands(wl, active)
        rollout = max(self.bucket_s(d, by_bucket[a], wl.tool_s_per_token) for a, d in zip(active, demands))
        rollout *= scales.rollout
        train = self.train_s(wl, len(rm.trainer_ranks), scales)
        return pipeline_step_s(rollout, train, self.cm.sync_s(len(rm.rollout_ranks)), self.lookahead), rollout, train

    # ---- search ------------------------------------------------------------------------------
    def _assignments(self):
        ok = [t for t in self.allowed_tp if self.cm.model.tp_divides(t)] or [1]
        tps = sorted(t for t in ok if t >= self.min_tp) or [max(ok)]
        for r in range(1, len(self.buckets) + 1):
            for active in itertools.combinations(range(len(self.buckets)), r):
                for combo in itertools.combinations_with_replacement(tps, r):
                    yield active, combo

    def _table(self, d: Demand, tp: int, wl: Workload) -> list[float]:
        """T(k) for k = 1.. instances, cut once within 1% of the single-stream tail (more cannot help)."""
        key = (d, tp)
        if key in self._tables:
            return self._tables[key]
        floor = self.tail_s(d, tp, 1, wl.tool_s_per_token)
        kmax = max(1, min(math.ceil(d.n), self.world_size // tp))
        out, best = [], math.inf
        for k in range(1, kmax + 1):
            best = min(best, self.bucket_s(d, {tp: k}, wl.tool_s_per_token))
            out.append(best)
            if best <= floor * 1.01:
                break
        self._tables[key] = out
        return out

    @staticmethod
    def _frontier(tables: list[list[float]], tps: tuple[int, ...]) -> tuple[list[float], list[int]]:
        """Candidate rollout times (ascending) and the devices each needs (non-increasing)."""
        cands = sorted({v for tab in tables for v in tab})
        floor = max(tab[-1] for tab in tables)
        times, needs = [], []
        negs = [[-v for v in tab] for tab in tables]
        for t in cands:
            if t < floor:
                continue
            need = sum(tp * (bisect.bisect_left(neg, -t) + 1) for neg, tp in zip(negs, tps))
            if needs and need >= needs[-1]:
                continue
            times.append(t)
            needs.append(need)
        return times, needs

    def best(self, wl: Workload, scales: Scales, *, current: RoleMap | None,
             rollout_range: tuple[int, int] | None = None) -> Choice:
        """The best layout for `wl` (module docstring, 3-4) with lo <= rollout devices <= hi."""
        lo, hi = rollout_range or (1, self.world_size - 1)
        g = self.world_size
        self._tables = {}
        best_r: dict[int, tuple[float, tuple, tuple, int]] = {}
        for active, tps in self._assignments():
            demands = self.demands(wl, active)
            if any(d.n <= 0 for d in demands):
                continue
            tables = [self._table(d, tp, wl) for d, tp in zip(demands, tps)]
            times, needs = self._frontier(tables, tps)
            rev = needs[::-1]  # ascending devices
            for r in range(1, g):
                i = bisect.bisect_right(rev, r)
                if i == 0:
                    continue
                t = times[len(needs) - i]
                if r not in best_r or t < best_r[r][0]:
                    best_r[r] = (t, active, tps, len(needs) - i)
        cur_r = len(current.rollout_ranks) if current else -1
        choices = []
        for r, (t, active, tps, _) in best_r.items():
            if not lo <= r <= hi or g - r < self.min_train:
                continue
            roll, train, sync = t * scales.rollout, self.train_s(wl, g - r, scales), self.cm.sync_s(r)
            choices.append(Choice(pipeline_step_s(roll, train, sync, self.lookahead), roll, train, sync, r, active, tps))
        if not choices:
            raise ValueError(
                f"planner: no layout of {g} devices fits (rollout TP >= {self.min_tp}, trainer >= {self.min_train} "
                f"devices, {lo}..{hi} rollout devices); add devices or set "
                "check_memory=False")
        best = min(choices, key=lambda c: (c.step_s, c.num_rollout != cur_r, c.num_rollout))
        best.ks = self._fill(wl, best, scales)
        return best

    def _fill(self, wl: Workload, c: Choice, scales: Scales) -> list[int]:
        """Instances per active bucket for the chosen R: the k_a(T), then the leftovers."""
        demands = self.demands(wl, c.active)
        tables = [self._table(d, tp, wl) for d, tp in zip(demands, c.tps)]
        self._tables = {}
        target = c.rollout_s / scales.rollout
        ks = [next((k for k, v in enumerate(tab, 1) if v <= target * (1 + 1e-12)), len(tab)) for tab in tables]
        left = c.num_rollout - sum(k * tp for k, tp in zip(ks, c.tps))
        assert left >= 0, f"allocation {ks} x {c.tps} exceeds {c.num_rollout} rollout devices"
        while left > 0:
            order = sorted(range(len(ks)), key=lambda i: -self.bucket_s(demands[i], {c.tps[i]: ks[i]}, wl.tool_s_per_token))
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
