"""Global resource planner: split G devices between training and rollout buckets, re-plan on drift.

Inputs: the world size G, the cost model, and recent history (per-step trajectory lengths, tool
latencies, train tokens). Output: a validated `RoleMap` inside a `PlanDecision`.

Algorithm:
1. Workload: pool the last `history_steps` steps' trajectory lengths; one step's demand per
   bucket b is (count n_b, tokens S_b, longest l_b), scaled to the mean trajectories per step.
   Admission is MLFQ (every request starts in the first active bucket), so bucket b serves the
   token segment between its lower and upper limit of every trajectory that reaches it.
2. Bucket time with k instances of TP t: max(throughput, tail), where throughput =
   S_b/k x step(B)/B with B = ceil(n_b/k) sequences per instance (+ re-prefill of migrated
   requests), and tail = l_b x step(b) + the tool time of the longest trajectory, where
   b = 1 + (B - 1) x mean/longest: the tail shares its instance with the bucket's other requests
   for part of its life, which is why mixing short and long requests on one instance slows the
   tail and a dedicated high-TP long bucket pays off.
3. For every set of active buckets (a trajectory whose bucket is inactive goes to the next
   longer active one, as the routers do) and every non-decreasing TP assignment from
   `allowed_tp`, the table T_a(k) gives, for each target time T, the devices needed
   sum_a t_a k_a(T); sweeping the candidate T values gives the best rollout time f(R) for
   every rollout size R at once (min-max allocation), in O(#candidates x log) per assignment.
   Tables stop once within 1% of the single-stream tail (more instances cannot help).
4. Step time of the async pipeline for R: max(f(R) x rollout_scale, train(G-R) x train_scale)
   + sync(R); pick the best R (ties: the current split, then fewer rollout devices). Devices
   left over after the k_a go to the slowest bucket, then as TP1 to the shortest one.
5. Re-plan every `interval_steps` steps, or at once when measured rollout/train leaves
   `ratio_band`; never before `min_history_trajectories` trajectories have finished. The
   `settle_steps` steps after the start or a switch (mixed loads/layouts) do not calibrate, and
   trigger only when their ratio is more than 2x outside the band (overlap cannot explain that). Measured
   rollout per step is min(batch critical path, step period): overlapping batches share devices. Apply only if current/new >= 1 + `min_gain_ratio` and the gain per step x
   remaining steps exceeds the reconfiguration cost, and, on a ratio trigger, only if it does not
   take ranks from the stage the clock says is short. `rollout_scale`/`train_scale` are EMAs of
   measured/predicted times on the layout that ran, so the model tracks the real machine.

Invariants (tests/test_scheduler_planner.py): every plan validates for any G in 2..1024 (ranks
add up, TP in {1,2,4,8}, both stages non-empty); rollout-heavy history gets more rollout devices
than training-heavy history; a long tail gets an instance of TP >= 2; on stationary input a
second plan never replaces the first (hysteresis); no re-plan from too little history; settling
steps leave the calibration alone and trigger only far outside the band; MLFQ demands count every trajectory in the first bucket;
a plan against the measured bottleneck is refused.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
from dataclasses import dataclass, field
from typing import Sequence

from scheduler.api import PlanDecision, StepStats
from scheduler.costmodel import CostModel
from scheduler.layout import VALID_TP, Bucket, RoleMap, RolloutInstance

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PlannerConfig:
    interval_steps: int = 10  # K: re-plan every K steps
    ratio_band: tuple[float, float] = (0.8, 1.25)  # re-plan at once if rollout_s/train_s leaves this band
    min_gain_ratio: float = 0.05  # apply a plan only if current/new step time >= 1 + this
    allowed_tp: tuple[int, ...] = (1, 2, 4, 8)  # TP degrees a rollout instance may have
    bucket_names: tuple[str, ...] = ("short", "medium", "long")  # rollout buckets, short to long
    bucket_max_tokens: tuple[int, ...] = (4096, 12288)  # limits of all buckets but the last
    heterogeneous: bool = True  # False: one unbounded bucket, one TP degree
    allow_realloc: bool = True  # False: keep the trainer/rollout split, re-plan the buckets only
    history_steps: int = 8  # steps of history the workload is built from
    check_memory: bool = True  # respect the cost model's minimum rollout TP and trainer size
    scale_ema: float = 0.5  # weight of the newest measured/predicted time ratio
    max_batch: int = 256  # most sequences one instance decodes at once (vLLM's max_num_seqs)
    max_seqs_per_device: int = 0  # also at most this many per device of an instance (0 = no such cap)
    min_history_trajectories: int = 128  # finished trajectories before the first re-plan (the length sample)
    settle_steps: int = 1  # steps after a layout change (or the start) that neither calibrate nor trigger

    def __post_init__(self) -> None:
        if self.interval_steps < 1 or self.history_steps < 1:
            raise ValueError(f"PlannerConfig: interval_steps={self.interval_steps} and history_steps="
                             f"{self.history_steps} must be >= 1")
        lo, hi = self.ratio_band
        if not 0 < lo <= 1 <= hi:
            raise ValueError(f"PlannerConfig: ratio_band={self.ratio_band} must satisfy 0 < low <= 1 <= high, e.g. (0.8, 1.25)")
        if self.min_gain_ratio < 0:
            raise ValueError(f"PlannerConfig: min_gain_ratio={self.min_gain_ratio} must be >= 0; 0.05 asks for a 5% gain")
        if not self.allowed_tp or any(t not in VALID_TP for t in self.allowed_tp):
            raise ValueError(f"PlannerConfig: allowed_tp={self.allowed_tp} must be a non-empty subset of {VALID_TP}")
        if len(self.bucket_max_tokens) != len(self.bucket_names) - 1 or any(
                a >= b for a, b in zip(self.bucket_max_tokens, self.bucket_max_tokens[1:])):
            raise ValueError(f"PlannerConfig: bucket_max_tokens={self.bucket_max_tokens} must be increasing, one per "
                             f"bucket but the last of {self.bucket_names}")
        if self.max_batch < 1 or self.max_seqs_per_device < 0:
            raise ValueError(f"PlannerConfig: max_batch={self.max_batch} must be >= 1 and max_seqs_per_device="
                             f"{self.max_seqs_per_device} >= 0, e.g. 256 and 0 (no per-device cap)")
        if self.min_history_trajectories < 1 or self.settle_steps < 0:
            raise ValueError(f"PlannerConfig: min_history_trajectories={self.min_history_trajectories} must be >= 1 "
                             f"and settle_steps="
                             f"{self.settle_steps} >= 0; e.g. 3 and 1")
        if not 0 < self.scale_ema <= 1:
            raise ValueError(f"PlannerConfig: scale_ema={self.scale_ema} must be in (0, 1]")

    def buckets(self) -> tuple[Bucket, ...]:
        if not self.heterogeneous:
            return (Bucket(name=self.bucket_names[0], max_tokens=None),)
        limits = (*self.bucket_max_tokens, None)
        return tuple(Bucket(name=n, max_tokens=m) for n, m in zip(self.bucket_names, limits))


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
        # Tool outputs are prefilled, not decoded: in agentic code repair they are ~3/4 of the tokens,
        # and counting them as decode made the tail look 3-4x longer than it is.
        known = [s for s in steps if len(s.decode_tokens) == len(s.trajectory_tokens)]
        decoded = sum(sum(s.decode_tokens) for s in known)
        frac = min(1.0, max(1e-3, decoded / max(1, sum(sum(s.trajectory_tokens) for s in known)))) if known else 1.0
        return cls(trajectory_tokens=lengths, num_trajectories=len(lengths) / len(steps), train_tokens=train,
                   tool_s_per_token=tool_s / max(1, sum(lengths)), decode_frac=frac)


@dataclass(frozen=True)
class _Demand:
    n: float  # trajectories per step
    tokens: float  # their total tokens per step
    longest: int  # longest trajectory
    reprefill: int  # tokens re-prefilled per request migrated in (0 for the first active bucket)
    decode_frac: float = 1.0  # share of the tokens that is decoded; the rest is prefilled (tool outputs)


@dataclass
class _Choice:
    step_s: float
    rollout_s: float
    train_s: float
    sync_s: float
    num_rollout: int
    active: tuple[int, ...]
    tps: tuple[int, ...]
    ks: list[int] = field(default_factory=list)


class GlobalPlanner:
    def __init__(self, cfg: PlannerConfig | None, cost_model: CostModel, world_size: int, remaining_steps: int,
                 current: RoleMap | None = None) -> None:
        if world_size < 2:
            raise ValueError(f"GlobalPlanner: world_size={world_size} must be >= 2 (one trainer + one rollout device)")
        self.cfg, self.cm, self.world_size = cfg or PlannerConfig(), cost_model, world_size
        self.remaining_steps = remaining_steps
        self.current = current
        self.rollout_scale = self.train_scale = 1.0
        self._history: list[StepStats] = []
        self._tables: dict = {}  # (demand, tp) -> T(k), rebuilt per search
        self._sorted_for: Workload | None = None  # the workload whose sorted lengths are cached
        self._sorted: tuple[list[int], list[int]] = ([], [])
        self._steps_since_plan = 0
        self._steps_on_layout = 0  # steps since the layout last changed (or since the start)
        self._last_now: float | None = None
        self._min_tp = cost_model.min_rollout_tp() if self.cfg.check_memory else 1
        self._min_train = cost_model.min_train_devices() if self.cfg.check_memory else 1

    # ---- public ------------------------------------------------------------------------------
    def plan(self, history: Workload | Sequence[StepStats]) -> PlanDecision:
        """Best plan for `history`, applied unconditionally (the initial plan)."""
        wl = history if isinstance(history, Workload) else Workload.from_stats(history)
        best = self._search(wl)
        role_map = self._build(best)
        cur_s = self._predict_map(self.current, wl)[0] if self.current else best.step_s
        moved = self._num_moved(self.current, role_map)
        self.current, self._steps_since_plan, self._steps_on_layout = role_map, 0, 0
        return self._decision(best, role_map, cur_s, moved, "initial plan")

    def on_step_end(self, stats: StepStats, now: float) -> PlanDecision | None:
        self.remaining_steps -= 1
        self._steps_since_plan += 1
        self._steps_on_layout += 1
        self._history = (self._history + [stats])[-self.cfg.history_steps:]
        # A step that ran while the async pipeline filled, or across a layout switch, measures a
        # mix of loads/layouts: calibrating on it (or reacting to its ratio) makes the planner chase
        # its own transients, e.g. 24 -> 8 trainers after step 0 and back again.
        settled = self._steps_on_layout > self.cfg.settle_steps
        rollout_s = self._rollout_per_step_s(stats, now)
        if settled:
            self._calibrate(stats, rollout_s)
        # No training time (a skipped no-signal step) is no measurement, not an infinitely fast trainer.
        ratio = rollout_s / stats.train_s if stats.train_s > 0 else math.nan  # logged as "ratio=nan"
        lo, hi = self.cfg.ratio_band
        drift = stats.train_s > 0 and not lo <= ratio <= hi
        # Two overlapping batches can at most double a batch's measured rollout; an imbalance far
        # beyond that (e.g. 29x on a first layout that swamps its one TP8 instance) is real, and
        # waiting two more steps on that layout cost more than the whole rest of the run gained.
        far = not lo / 2 <= ratio <= 2 * hi
        # Too small a length sample misjudges the tail: do not move ranks on it.
        if sum(len(s.trajectory_tokens) for s in self._history) < self.cfg.min_history_trajectories:
            return None
        if self._steps_since_plan < self.cfg.interval_steps and not (drift and (settled or far)):
            return None
        if not any(s.trajectory_tokens for s in self._history):
            return None
        self._steps_since_plan = 0
        wl = Workload.from_stats(self._history)
        if self.current is None:
            return self.plan(wl)
        # The stage the measurement says is short of ranks; a plan taking ranks from it is refused.
        starved = ("rollout" if ratio > hi else "train") if drift else None
        return self._maybe_apply(wl, f"ratio={ratio:.2f}" + (" outside band" if drift else " periodic"), starved)

    def _maybe_apply(self, wl: Workload, why: str, starved: str | None = None) -> PlanDecision | None:
        best = self._search(wl)
        cur_s = self._predict_map(self.current, wl)[0]
        role_map = self._build(best)
        moved = self._num_moved(self.current, role_map)
        grow = len(role_map.rollout_ranks) - len(self.current.rollout_ranks)
        if (starved == "rollout" and grow < 0) or (starved == "train" and grow > 0):
            # An uncalibrated model can contradict the clock (a trainer that skipped a no-signal
            # step measures ~0 s while the model still predicts minutes): trust the clock.
            logger.info("plan kept (%s): %s is the measured bottleneck but the model's best plan gives it fewer ranks",
                        why, starved)
            return None
        reconfig = self.cm.reconfig_s(moved)
        gain = cur_s - best.step_s
        if moved == 0 or cur_s < best.step_s * (1 + self.cfg.min_gain_ratio) or gain * max(0, self.remaining_steps) <= reconfig:
            logger.debug("plan kept (%s): current %.3fs vs new %.3fs, reconfig %.3fs", why, cur_s, best.step_s, reconfig)
            return None
        self.current, self._steps_on_layout = role_map, 0
        return self._decision(best, role_map, cur_s, moved, why)

    # ---- model -----------------------------------------------------------------------------
    def _demands(self, wl: Workload, active: tuple[int, ...]) -> list[_Demand]:
        """Per active bucket: the work one step sends there under MLFQ admission.

        Every request starts in the first active bucket and moves up as it outgrows each limit, so
        a bucket serves the segment (its lower limit, its upper limit] of every trajectory that
        reaches it, and each arrival re-prefills the lower limit's tokens. Counting only the
        trajectories that *finish* in a bucket left the first bucket with a tenth of the load it
        really gets: the planner gave it one TP1 instance and every admission queued there.
        The last bucket's tail is the whole longest trajectory (C-MLFQ's causal signal promotes it
        early; the demotion-only path is slower, which calibration absorbs)."""
        if self._sorted_for is not wl:  # sort once per workload; each call is then O(buckets log n)
            lens = sorted(wl.trajectory_tokens)
            self._sorted_for, self._sorted = wl, (lens, [0, *itertools.accumulate(lens)])
        lens, prefix = self._sorted
        limits = [b.max_tokens for b in self.cfg.buckets()]
        eff = [limits[a] for a in active[:-1]]
        n = len(lens)
        cuts = [0, *(bisect.bisect_right(lens, lim) for lim in eff), n]
        scale = wl.num_trajectories / n
        out = []
        for i, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
            base = eff[i - 1] if i > 0 else 0
            top = eff[i] if i < len(eff) else None
            tokens = prefix[hi] - prefix[lo] - (hi - lo) * base + ((n - hi) * (top - base) if top is not None else 0)
            longest = lens[-1] if top is None else min(lens[-1], top) - base
            out.append(_Demand(n=(n - lo) * scale, tokens=tokens * scale, longest=longest if n > lo else 0,
                               reprefill=base, decode_frac=wl.decode_frac))
        return out

    def _bucket_s(self, d: _Demand, tp_counts: dict[int, int], tool_s_per_token: float) -> float:
        if d.n <= 0:
            return 0.0
        batch = max(1, math.ceil(d.n / sum(tp_counts.values())))
        return max(self._thr_s(d, tp_counts), self._tail_s(d, max(tp_counts), batch, tool_s_per_token))

    def _thr_s(self, d: _Demand, tp_counts: dict[int, int]) -> float:
        batch = max(1, math.ceil(d.n / sum(tp_counts.values())))
        ctx = d.reprefill + d.tokens / d.n / 2  # segments above the first start at their lower limit
        rate = 0.0
        for tp, c in tp_counts.items():
            # Sequences beyond what fits in KV memory (or max_batch) wait: they add time, not throughput.
            b = min(batch, self._seq_cap(tp), self.cm.max_batch(2 * ctx, tp))
            rate += c * b / self.cm.decode_step_s(b, ctx, tp)
        f = d.decode_frac
        num_inst = sum(tp_counts.values())
        thr = d.tokens * f / rate + d.tokens * (1 - f) / num_inst * self._prefill_per_token_s(max(tp_counts))
        if d.reprefill:
            thr += batch * self.cm.prefill_s(d.reprefill, max(tp_counts))
        return thr

    def _tail_s(self, d: _Demand, tp: int, batch: int, tool_s_per_token: float) -> float:
        """The longest trajectory's decode time: it shares its instance with the bucket's others for
        about mean/longest of its life, so a bucket mixing short and long slows its tail."""
        share = min(1.0, d.tokens / d.n / max(1, d.longest))
        b = 1 + (min(batch, self._seq_cap(tp)) - 1) * share
        f = d.decode_frac
        decode_s = d.longest * f * self.cm.decode_step_s(b, d.longest / 2, tp)
        return decode_s + d.longest * (1 - f) * self._prefill_per_token_s(tp) + d.longest * tool_s_per_token

    def _seq_cap(self, tp: int) -> int:
        """Most sequences a TP-`tp` instance runs at once: an engine cap that scales with its devices
        (the simulator's) gives TP1 instances a small batch, which is what makes them slow per device."""
        per_device = self.cfg.max_seqs_per_device
        return min(self.cfg.max_batch, per_device * tp) if per_device else self.cfg.max_batch

    def _prefill_per_token_s(self, tp: int) -> float:
        # tool outputs arrive in chunks of a few hundred to a few thousand tokens
        return self.cm.prefill_s(1024, tp) / 1024

    def _train_s(self, wl: Workload, num_trainer: int) -> float:
        return self.cm.train_s(int(wl.train_tokens), num_trainer) * self.train_scale

    def _predict_map(self, rm: RoleMap, wl: Workload) -> tuple[float, float, float]:
        """(step_s, rollout_s, train_s) predicted for an existing role map."""
        names = [b.name for b in self.cfg.buckets()]
        by_bucket: dict[int, dict[int, int]] = {}
        for inst in rm.instances:
            bi = names.index(inst.bucket) if inst.bucket in names else len(names) - 1
            counts = by_bucket.setdefault(bi, {})
            counts[inst.tp] = counts.get(inst.tp, 0) + 1
        active = tuple(sorted(by_bucket))
        demands = self._demands(wl, active)
        rollout = max(self._bucket_s(d, by_bucket[a], wl.tool_s_per_token) for a, d in zip(active, demands))
        rollout *= self.rollout_scale
        train = self._train_s(wl, len(rm.trainer_ranks))
        return max(rollout, train) + self.cm.sync_s(len(rm.rollout_ranks)), rollout, train

    def _rollout_per_step_s(self, stats: StepStats, now: float) -> float:
        """Rollout seconds one step costs the pipeline: the batch's critical path, but no more than
        the step period. When rollout is the bottleneck, batch j+1 is admitted while batch j still
        runs, so each batch's admission-to-finish span covers about two periods of shared devices;
        calibrating on it doubled the predicted rollout and the split flip-flopped (8 <-> 17 trainers)."""
        last, self._last_now = self._last_now, now
        period = now - last if last is not None else math.inf
        # A period shorter than the training it contains is not a real clock (tests pass step numbers).
        if period < stats.train_s:
            return stats.rollout_s
        return min(stats.rollout_s, period)

    def _calibrate(self, stats: StepStats, rollout_s: float) -> None:
        rm = stats.role_map or self.current
        if rm is None or rm.colocated or not stats.trajectory_tokens:
            return
        wl = Workload.from_stats([stats])
        saved, self.rollout_scale, self.train_scale = (self.rollout_scale, self.train_scale), 1.0, 1.0
        _, pred_r, pred_t = self._predict_map(rm, wl)
        self.rollout_scale, self.train_scale = saved
        a = self.cfg.scale_ema
        if rollout_s > 0 and pred_r > 0:
            self.rollout_scale = (1 - a) * self.rollout_scale + a * min(1e3, max(1e-3, rollout_s / pred_r))
        if stats.train_s > 0 and pred_t > 0:
            self.train_scale = (1 - a) * self.train_scale + a * min(1e3, max(1e-3, stats.train_s / pred_t))

    # ---- search ----------------------------------------------------------------------------
    def _assignments(self, num_buckets: int):
        ok = [t for t in self.cfg.allowed_tp if self.cm.model.tp_divides(t)] or [1]
        tps = sorted(t for t in ok if t >= self._min_tp) or [max(ok)]
        for r in range(1, num_buckets + 1):
            for active in itertools.combinations(range(num_buckets), r):
                for combo in itertools.combinations_with_replacement(tps, r):
                    yield active, combo

    def _table(self, d: _Demand, tp: int, wl: Workload) -> list[float]:
        """T(k) for k = 1.. instances, cut once within 1% of the single-stream tail (more cannot help)."""
        key = (d, tp)
        if key in self._tables:
            return self._tables[key]
        floor = self._tail_s(d, tp, 1, wl.tool_s_per_token)
        kmax = max(1, min(math.ceil(d.n), self.world_size // tp))
        out, best = [], math.inf
        for k in range(1, kmax + 1):
            best = min(best, self._bucket_s(d, {tp: k}, wl.tool_s_per_token))
            out.append(best)
            if best <= floor * 1.01:
                break
        self._tables[key] = out
        return out

    def _frontier(self, tables: list[list[float]], tps: tuple[int, ...]) -> tuple[list[float], list[int]]:
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

    def _search(self, wl: Workload) -> _Choice:
        g, buckets = self.world_size, self.cfg.buckets()
        self._tables: dict[tuple[_Demand, int], list[float]] = {}  # valid for this workload only
        fixed_r = len(self.current.rollout_ranks) if (self.current and not self.cfg.allow_realloc) else None
        best_r: dict[int, tuple[float, tuple, tuple, int]] = {}
        for active, tps in self._assignments(len(buckets)):
            demands = self._demands(wl, active)
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
        cur_r = len(self.current.rollout_ranks) if self.current else -1
        choices = []
        for r, (t, active, tps, _) in best_r.items():
            if (fixed_r is not None and r != fixed_r) or g - r < self._min_train:
                continue
            roll, train, sync = t * self.rollout_scale, self._train_s(wl, g - r), self.cm.sync_s(r)
            choices.append(_Choice(max(roll, train) + sync, roll, train, sync, r, active, tps))
        if not choices:
            raise ValueError(
                f"planner: no layout of {g} devices fits (rollout TP >= {self._min_tp}, trainer >= {self._min_train} "
                f"devices{', split fixed at ' + str(fixed_r) if fixed_r else ''}); add devices or set check_memory=False"
            )
        best = min(choices, key=lambda c: (c.step_s, c.num_rollout != cur_r, c.num_rollout))
        best.ks = self._fill(wl, best)
        return best

    def _fill(self, wl: Workload, c: _Choice) -> list[int]:
        """Instances per active bucket for the chosen R: the k_a(T), then the leftovers."""
        demands = self._demands(wl, c.active)
        tables = [self._table(d, tp, wl) for d, tp in zip(demands, c.tps)]
        self._tables = {}
        target = c.rollout_s / self.rollout_scale
        ks = [next((k for k, v in enumerate(tab, 1) if v <= target * (1 + 1e-12)), len(tab)) for tab in tables]
        left = c.num_rollout - sum(k * tp for k, tp in zip(ks, c.tps))
        assert left >= 0, f"allocation {ks} x {c.tps} exceeds {c.num_rollout} rollout devices"
        while left > 0:
            order = sorted(range(len(ks)), key=lambda i: -self._bucket_s(demands[i], {c.tps[i]: ks[i]}, wl.tool_s_per_token))
            i = next((i for i in order if c.tps[i] <= left), None)
            if i is None:
                break
            ks[i] += 1
            left -= c.tps[i]
        c.ks = ks
        return ks

    # ---- output ----------------------------------------------------------------------------
    def _build(self, c: _Choice) -> RoleMap:
        g, buckets = self.world_size, self.cfg.buckets()
        spec = [(buckets[a].name, tp) for a, tp, k in zip(c.active, c.tps, c.ks) for _ in range(k)]
        used = sum(tp for _, tp in spec)
        left = c.num_rollout - used
        if left and self._min_tp == 1:
            spec = [(buckets[c.active[0]].name, 1)] * left + spec
        num_trainer = g - sum(tp for _, tp in spec)
        old = {(i.ranks, i.bucket): i.instance_id for i in self.current.instances} if self.current else {}
        next_id = max(old.values(), default=-1) + 1
        instances, rank = [], num_trainer
        for name, tp in spec:
            ranks = tuple(range(rank, rank + tp))
            iid = old.get((ranks, name))
            if iid is None:
                iid, next_id = next_id, next_id + 1
            instances.append(RolloutInstance(instance_id=iid, bucket=name, ranks=ranks))
            rank += tp
        version = self.current.version + 1 if self.current else 0
        return RoleMap(version=version, world_size=g, trainer_ranks=tuple(range(num_trainer)),
                       instances=tuple(instances), buckets=buckets).validate()

    @staticmethod
    def _num_moved(old: RoleMap | None, new: RoleMap) -> int:
        if old is None:
            return new.world_size

        def where(rm: RoleMap, r: int):
            inst = rm.instance_of(r)
            return ("trainer",) if inst is None else (inst.bucket, inst.ranks)

        return sum(1 for r in range(new.world_size) if r >= old.world_size or where(old, r) != where(new, r))

    def _decision(self, c: _Choice, rm: RoleMap, cur_s: float, moved: int, why: str) -> PlanDecision:
        details = {"rollout_s": c.rollout_s, "train_s": c.train_s, "sync_s": c.sync_s,
                   "num_trainer": len(rm.trainer_ranks), "train_layout": f"fsdp{len(rm.trainer_ranks)}",
                   "num_moved": moved, "rollout_scale": self.rollout_scale, "train_scale": self.train_scale}
        reason = f"{why}: {rm.describe()} predicted {c.step_s:.3f}s vs {cur_s:.3f}s"
        logger.info("planner %s", reason)
        return PlanDecision(role_map=rm, predicted_step_s=c.step_s, current_step_s=cur_s,
                            reconfig_s=self.cm.reconfig_s(moved), reason=reason, details=details)
