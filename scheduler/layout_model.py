"""The planner's model: the predicted step time of a layout for a workload.

`GlobalPlanner` (scheduler/planner.py) decides *when* to re-plan, `LayoutSearch`
(scheduler/layout_search.py) searches the layouts; this module prices one: given a `Workload`
(recent trajectory lengths, tool time, training tokens) it predicts the rollout, training and
step time of a role map.

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
4. Step time (`pipeline_step_s`): with L batches admitted ahead of the trainer, a batch's cycle
   is rollout + train + sync before the batch L+1 steps later may start, and L+1 batches share
   it: step = max(train + sync, (rollout + train + sync) / (L + 1)), rollout = f(R) x
   rollout_scale, train = train(G-R) x train_scale. (Modelled as max(rollout, train) + sync, the
   planner took trainers for a tail the overlap already hid: 48xA800 math ran 13% slower than
   with the split kept.)
5. On a CPU whose cores every rank shares (a measured profile's `cores`), each stage was measured
   with its own ranks busy: rollout and training are stretched by processor sharing beside the
   other stage for the part of the step they overlap (`CostModel.on_shared_cores`). (Priced as if
   each rank had a core, a second SmolLM2 trainer rank on 2 cores looked 1.39x faster; beside the
   rollout it was no faster, and the planner had moved a rank for it.)

The length sample (`Workload.from_stats`) takes each step's finished trajectories and, for
finish-order batches, the ones still running as lower bounds (`uncensored`: each imputed as the
median finished length at least as long), so a batch of the first groups to finish does not
teach the planner that trajectories are short (libra-partial at bound 4 on length_drift moved
to one rollout device on that bias: +55% throughput without it, 3 seeds).

Invariants (tests/scheduler/test_scheduler_planner.py, tests/scheduler/test_layout_model.py): MLFQ demands count every trajectory in the first
bucket; the batch cap is per instance whatever its TP; a lower decoded share shrinks the tail;
the critical trajectory decodes on the first buckets until its first signal or their limit, and
a late signal keeps low-TP instances off its path.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
import math
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from scheduler.api import StepStats
from scheduler.costmodel import CostModel, MemoizedCost
from scheduler.layout import Bucket, RoleMap


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
        finished = tuple(t for s in steps for t in s.trajectory_tokens)
        signals = () if any(len(s.signal_tokens) != len(s.trajectory_tokens) for s in steps) else \
            tuple(t for s in steps for t in s.signal_tokens)
        censored = tuple(c for s in steps for c in s.censored_tokens)
        lengths, signals = uncensored(finished, signals, censored)
        tool_s = sum(sum(s.tool_latency_s) for s in steps)
        train = sum(s.train_tokens or sum(s.trajectory_tokens) for s in steps) / len(steps)
        # Tool outputs are prefilled, not decoded: counting them as decode makes the tail look longer.
        known = [s for s in steps if len(s.decode_tokens) == len(s.trajectory_tokens)]
        decoded = sum(sum(s.decode_tokens) for s in known)
        frac = min(1.0, max(1e-3, decoded / max(1, sum(sum(s.trajectory_tokens) for s in known)))) if known else 1.0
        return cls(trajectory_tokens=lengths, num_trajectories=len(finished) / len(steps), train_tokens=train,
                   tool_s_per_token=tool_s / max(1, sum(finished)), decode_frac=frac, signal_tokens=signals)


def uncensored(finished: tuple[int, ...], signals: tuple[int, ...], censored: tuple[int, ...]) -> tuple[tuple, tuple]:
    """The length sample with each censored length (a trajectory still running, `c` tokens so far) imputed as
    the median of the finished lengths of at least `c` (with that trajectory's signal), or `c` itself when
    none finished that long (its lower bound: the longest seen). Without censoring the sample is unchanged."""
    if not censored:
        return finished, signals
    order = sorted(range(len(finished)), key=finished.__getitem__)
    ranked = [finished[i] for i in order]
    lengths, sig = list(finished), list(signals)
    for c in censored:
        lo = bisect.bisect_left(ranked, c)  # ranked[lo:] finished at least c tokens long
        if lo < len(ranked):
            i = order[lo + (len(ranked) - lo) // 2]
            lengths.append(finished[i])
            sig.append(signals[i] if signals else 0)
        else:
            lengths.append(c)
            sig.append(c)
    return tuple(lengths), tuple(sig) if signals else ()


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
    """A demand's throughput-time constants on one TP (`LayoutModel._terms`)."""

    ctx: float  # mean context of its decode steps
    cap: int  # sequences one instance decodes at once (max_batch, or fewer where KV memory runs out)
    decoded: float  # tokens decoded per step
    prefilled: float  # tokens prefilled per step (tool outputs)
    prefill_per_token_s: float
    reprefill_s: float  # re-prefill of one request migrated in (0.0 in the first active bucket)


@dataclass
class Scales:
    """Measured/predicted time ratios the planner keeps (EMAs), applied to every prediction."""

    rollout: float = 1.0
    train: float = 1.0

    def observe(self, weight: float, *, rollout: tuple[float, float] | None = None,
                train: tuple[float, float] | None = None) -> None:
        """Move each EMA `weight` of the way to a (measured, predicted) pair's ratio (a pair with a zero skipped)."""
        for name, pair in (("rollout", rollout), ("train", train)):
            if pair is not None and pair[0] > 0 and pair[1] > 0:
                ratio = min(1e3, max(1e-3, pair[0] / pair[1]))
                setattr(self, name, (1 - weight) * getattr(self, name) + weight * ratio)


def pipeline_step_s(rollout_s: float, train_s: float, sync_s: float, lookahead: int) -> float:
    """Step period when `lookahead` batches are admitted ahead of the trainer (module docstring, 4)."""
    return max(train_s + sync_s, (rollout_s + train_s + sync_s) / (lookahead + 1))


class LayoutModel:
    """Prices a role map for a workload (module docstring); `LayoutSearch` searches with it."""

    def __init__(self, cm: CostModel, buckets: tuple[Bucket, ...], *, max_batch: int, lookahead: int = 1) -> None:
        if lookahead < 0:
            raise ValueError(f"LayoutSearch: lookahead={lookahead} must be >= 0 (0: synchronous)")
        self.cm, self.buckets, self.lookahead = MemoizedCost(cm), buckets, lookahead
        self.max_batch = max_batch  # sequences per instance, any TP
        self._sorted_for: Workload | None = None  # the workload whose sorted lengths are in use
        self._sorted: tuple[list[int], list[int], list[tuple[int, int]]] = ([], [], [])
        self._ppt: dict[int, float] = {}  # TP -> `_prefill_per_token_s`
        self._pieces_memo: dict[tuple[int, ...], list[list[tuple[int, int]]]] = {}  # `_candidate_pieces`
        self._piece_memo: dict[tuple[int, int, int], float] = {}  # `_piece_s`
        # id(workload) -> (workload, its sorted sample, its pieces memo, its piece memo) of the last few seen:
        # a floored search alternates between two workloads, which re-sorted both samples at every turn
        self._samples: dict[int, tuple] = {}

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
            entry = self._samples.get(id(wl))
            if entry is None or entry[0] is not wl:
                lens = sorted(wl.trajectory_tokens)
                # the longest (total, signal) pairs, longest first: sorted(..., reverse=True)[:CRITICAL_CANDIDATES]
                pairs = heapq.nlargest(CRITICAL_CANDIDATES, zip(wl.trajectory_tokens, wl.signal_tokens)) if wl.signal_tokens else []
                if len(self._samples) >= 4:  # a few workloads at a time: memory stays bounded
                    self._samples.clear()
                entry = self._samples[id(wl)] = (wl, (lens, [0, *itertools.accumulate(lens)], pairs), {}, {})
            self._sorted_for, self._sorted, self._pieces_memo, self._piece_memo = entry
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

    def instances_by_bucket(self, rm: RoleMap) -> dict[int, dict[int, int]]:
        """Bucket index -> {TP: instances} of a role map (an unknown bucket name counts as the last bucket)."""
        names = [b.name for b in self.buckets]
        by_bucket: dict[int, dict[int, int]] = {}
        for inst in rm.instances:
            bi = names.index(inst.bucket) if inst.bucket in names else len(names) - 1
            counts = by_bucket.setdefault(bi, {})
            counts[inst.tp] = counts.get(inst.tp, 0) + 1
        return by_bucket

    def throughput_s(self, rm: RoleMap, wl: Workload) -> float:
        """The slowest bucket's time for its work on `rm` at full throughput, tails aside (on shared cores,
        beside a trainer that trains all the while where the stages overlap)."""
        by_bucket = self.instances_by_bucket(rm)
        active = tuple(sorted(by_bucket))
        thr = max(self._thr_s(d, by_bucket[a]) for a, d in zip(active, self.demands(wl, active)) if d.n > 0)
        return self.on_cores(rm, thr, math.inf)[0]

    def overlaps(self, rm: RoleMap) -> bool:
        """Whether `rm`'s rollout runs while its trainer trains (a pipelined split; colocated ranks alternate)."""
        return self.lookahead > 0 and not rm.colocated

    def on_cores(self, rm: RoleMap, rollout_s: float, train_s: float) -> tuple[float, float]:
        """(rollout_s, train_s) of `rm` where every rank shares a CPU's cores (`CostModel.on_shared_cores`)."""
        return self.cm.on_shared_cores(rollout_s, train_s, num_rollout=len(rm.rollout_ranks),
                                       num_trainer=len(rm.trainer_ranks), overlap=self.overlaps(rm))

    def predict(self, rm: RoleMap, wl: Workload, scales: Scales) -> tuple[float, float, float]:
        """(step_s, rollout_s, train_s) predicted for an existing role map."""
        by_bucket = self.instances_by_bucket(rm)
        active = tuple(sorted(by_bucket))
        tps = tuple(max(by_bucket[a]) for a in active)
        demands = self.demands_on(wl, active, tps)
        tool = wl.tool_s_per_token
        path = sum(self.path_s(d, tp, sum(by_bucket[a].values()), tool) for a, d, tp in zip(active, demands, tps))
        rollout = max(path, *(self.bucket_s(d, by_bucket[a], tool) for a, d in zip(active, demands)))
        rollout, train = self.on_cores(rm, rollout, self.train_s(wl, len(rm.trainer_ranks), Scales()))
        rollout, train = rollout * scales.rollout, train * scales.train
        sync = self.cm.sync_s(len(rm.rollout_ranks), len(rm.trainer_ranks))
        return pipeline_step_s(rollout, train, sync, self.lookahead), rollout, train
