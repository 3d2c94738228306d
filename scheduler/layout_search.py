"""The planner's search: the best layout and rollout/training split for a workload.

`GlobalPlanner` (scheduler/planner.py) decides *when* to re-plan; this module answers *what*,
pricing candidates with `LayoutModel` (scheduler/layout_model.py: demands per bucket, bucket and
critical-path times, the pipelined step time).

Algorithm:
1. For every set of active buckets and every non-decreasing TP assignment from `allowed_tp`,
   the table T_a(k) gives, for each target time T, the fewest instances per bucket whose own
   time fits; the critical path through them may exceed T, so each candidate is worth
   max(T, path). Sweeping the candidate T values gives the best rollout time f(R) for every
   rollout size R at once. Tables stop once within 1% of the single-stream tail.
2. The step time of each R (`pipeline_step_s`) with training on the other G - R devices; the
   best R in the allowed range wins (ties: the current split, then fewer rollout devices).
   Devices left over go to the slowest bucket (own time or piece of the path), then as TP1 to
   the shortest one.
3. `switch_of` says what a change of role map costs the runtime, in kind.

Invariants (tests/scheduler/test_scheduler_planner.py): every layout built validates for any G in
2..1024.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from scheduler.costmodel import CostModel
from scheduler.layout import Bucket, RoleMap, RolloutInstance
from scheduler.layout_model import Demand, LayoutModel, Scales, Workload, pipeline_step_s


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


class LayoutSearch(LayoutModel):
    def __init__(self, cm: CostModel, world_size: int, buckets: tuple[Bucket, ...], *, allowed_tp: tuple[int, ...],
                 max_batch: int, min_tp: int, min_train: int, lookahead: int = 1, check_host: bool = True) -> None:
        super().__init__(cm, buckets, max_batch=max_batch, lookahead=lookahead)
        self.world_size, self.allowed_tp = world_size, allowed_tp
        self.min_tp, self.min_train = min_tp, min_train
        self.check_host = check_host  # a CPU run's ranks share the host's memory: no split past it
        self._tables: dict = {}  # (demand without its path piece, tp) -> T(k), valid for one search
        self._paths: dict = {}  # (that key, path piece) -> P(k), valid for one search
        self._fills: dict = {}  # (active, tps) -> (demands, {(bucket, k): its time}) of `_fill`, valid for one search

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
             rollout_range: tuple[int, int] | None = None, floor: tuple[Workload, int] | None = None) -> Choice:
        """The best layout for `wl` (module docstring, 1-2) with lo <= rollout devices <= hi; with `floor`
        (work, steps), no step is priced below the rollout's throughput for that work spread over those steps."""
        lo, hi = rollout_range or (1, self.world_size - 1)
        g = self.world_size
        self._tables, self._paths, self._fills = {}, {}, {}
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
        fits = self.cm.host_fits if self.check_host else None  # looked up once: a 1,024-device search asks per size
        shared = self.cm.on_shared_cores if self.cm.shared_cores else None
        ranked: list[tuple[tuple, Choice]] = []  # (key, choice): least step time, then the current split, then fewer devices
        for r, entry in enumerate(best_r):
            if entry is None or not lo <= r <= hi or g - r < self.min_train:
                continue
            if fits is not None and not fits(g - r, r):
                continue
            t, active, tps, ks = entry
            roll, train = t, self.train_s(wl, g - r, Scales())
            if shared is not None:
                roll, train = shared(roll, train, num_rollout=r, num_trainer=g - r, overlap=self.lookahead > 0)
            roll, train, sync = roll * scales.rollout, train * scales.train, self.cm.sync_s(r, g - r)
            step = pipeline_step_s(roll, train, sync, self.lookahead)
            ranked.append(((step, r != cur_r, r), Choice(step, roll, train, sync, r, active, tps, list(ks))))
        if not ranked:
            raise ValueError(
                f"planner: no layout of {g} devices fits (rollout TP >= {self.min_tp}, trainer >= {self.min_train} "
                f"devices, {lo}..{hi} rollout devices{', within the host memory' if self.check_host else ''}); add "
                "devices (on a CPU: memory, or fewer ranks with --nproc) or set check_memory=False")
        ranked.sort(key=lambda kc: kc[0])
        best = ranked[0][1] if floor is None else self._floored(wl, ranked, floor, scales)
        if floor is None:
            best.ks = self._fill(wl, best)
        self._tables, self._paths, self._fills = {}, {}, {}
        return best

    def _floored(self, wl: Workload, ranked: list[tuple[tuple, Choice]], floor: tuple[Workload, int],
                 scales: Scales) -> Choice:
        """The first of `ranked` by max(its pipelined step, the rollout's throughput floor): `floor` = (the work that
        must flow through the rollout, steps it spans). A pipeline one step ahead or more overlaps a batch's rollout
        with others', so its step is at least the time the instances take for a step's work at full throughput
        (`throughput_s`); the pipelined formula alone starves the rollout at lookahead >= 2 (it divides the rollout's
        time by L + 1). The floor never lowers a step, so the scan stops at the first pipelined step above the best."""
        work, steps = floor
        best: tuple[tuple, Choice] | None = None
        work_demands: dict[tuple[int, ...], list] = {}  # active -> `demands(work, active)`
        for key, c in ranked:
            if best is not None and key[0] > best[0][0]:
                break
            c.ks = self._fill(wl, c)
            counts = {a: {} for a in c.active}
            for a, tp, k in zip(c.active, c.tps, c.ks):
                counts[a][tp] = counts[a].get(tp, 0) + k
            demands = work_demands.get(c.active)
            if demands is None:
                demands = work_demands[c.active] = self.demands(work, c.active)
            thr = max(self._thr_s(d, counts[a]) for a, d in zip(c.active, demands) if d.n > 0 and counts[a])
            if self.cm.shared_cores:
                thr = self.cm.on_shared_cores(thr, math.inf, num_rollout=c.num_rollout,
                                              num_trainer=self.world_size - c.num_rollout, overlap=self.lookahead > 0)[0]
            step = max(c.step_s, thr * scales.rollout / steps)
            if best is None or (step, *key[1:]) < best[0]:
                best = ((step, *key[1:]), Choice(step, c.rollout_s, c.train_s, c.sync_s, c.num_rollout, c.active, c.tps, c.ks))
        return best[1]

    def _fill(self, wl: Workload, c: Choice) -> list[int]:
        """Instances per active bucket for the chosen R: the frontier's k_a, then the leftovers (the
        candidates of one search share (active, tps), so their demands and bucket times are kept)."""
        fill = self._fills.get((c.active, c.tps))
        if fill is None:
            fill = self._fills[c.active, c.tps] = (self.demands_on(wl, c.active, c.tps), {})
        demands, times = fill
        ks = list(c.ks)
        left = c.num_rollout - sum(k * tp for k, tp in zip(ks, c.tps))
        assert left >= 0, f"allocation {ks} x {c.tps} exceeds {c.num_rollout} rollout devices"
        tool = wl.tool_s_per_token

        def time_of(i: int) -> float:  # bucket i's own time or its piece of the path, with ks[i] instances
            t = times.get((i, ks[i]))
            if t is None:
                t = times[i, ks[i]] = max(self.bucket_s(demands[i], {c.tps[i]: ks[i]}, tool),
                                          self.path_s(demands[i], c.tps[i], ks[i], tool))
            return t
        while left > 0:
            order = sorted(range(len(ks)), key=lambda i: -time_of(i))
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


def switch_of(old: RoleMap | None, new: RoleMap) -> Switch:
    """The kind of change from `old` to `new` (a bucket relabel keeps every engine and the trainer)."""
    if old is None:
        return Switch(new.world_size, True)
    return Switch(num_moved(old, new), old.trainer_ranks != new.trainer_ranks)
