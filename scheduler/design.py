"""Libra's choice of design: which layout family, batching and trained-lag bound reach the reward target first.

The planner (scheduler/planner.py) re-plans a layout *within* a design; this module chooses the
design itself, among every layout a peer uses and libra's own, by predicted time to the reward
target (docs/design.md, Scheduling, "The planner's objective"):

  split, step batches       libra: C-MLFQ over heterogeneous buckets, lookahead L (L steps of lag)
  split, finish-order       libra-partial: the batch is the first groups to finish, the tail carries on
  colocated, on-policy      colocate (L = 0): every rank generates, then every rank trains
  colocated, time-shared    libra-hybrid (L = 1): every rank hosts an instance and trains; free
                            instances start the next step's trajectories while the tail finishes

Algorithm (`rank_designs`):
1. Each candidate's step time comes from the planner's own model (`LayoutSearch`, `LayoutModel`)
   on a length sample (measured, or the bench's prior before step 1):
   - split, step batches: the best split at lookahead L (`pipeline_step_s`), and at least the
     throughput of its buckets (batches in flight share the devices);
   - split, finish-order: no barrier: L + 1 steps' groups are in flight, but the newest step's
     started a step late and overtakes little, so a batch is about the first 1/L of the other
     groups to complete, and a group completes with its slowest sample: the batch waits for
     lengths up to the quantile (1/L)^(1/n) (n the group size; at L = 1 the whole tail); the split
     is searched for that capped sample (`finish_order_sample`), and the step is at least the
     whole sample's throughput with L + 1 steps decoding together (larger batches, a better rate
     per sequence). Its trained lag is bounded too (the step core's `bound_trained_lag`), at the
     largest lag the run allows, B (`design_lag_cap`, the user's bound, not the largest of the lags
     below it: a cap of 8 admits at L = 1, 2 or 4 and trains by lag 8): a group is trained B versions
     after its admission at the latest, so a finish-order design runs at L < B only (at L = B the
     batch would wait for a whole step).
     What the bound costs is not priced (docs/benchmarks.md: 0-13% later to the target on the paper
     presets, where admission alone trained groups at lag 5-9 under designs of lag 2).
     `bound_trained_lag=False` bounds admission only, as AReaL and the finish-order peers do.
   - every split is searched with its rollout's throughput as a floor (`LayoutSearch.best(floor=)`):
     batches in flight share the instances, so no step is shorter than their time for a step's work. (Priced on the step-batched layout with the whole sample, lag 1, 2 and 4
     came out alike; simulated steps were 194, 140 and 109 s on 160 x 910B3 swe.)
   - colocated TP t, on-policy: rollout on all G ranks + training on all G + a local sync;
   - colocated TP t, time-shared: training + sync + the generation window, which must hold a
     batch's throughput and, with one batch started early, half its critical path:
     max(throughput, rollout / (L + 1)).
2. Progress per step: a trajectory trained k versions late is worth gamma^k of a fresh one
   (`MEASURED_LAG_GAMMA`, measured by real GRPO with forced lags); in every one of these designs
   the trained lag settles at the lookahead L (simulated: 0.95 at L = 1, 1.85 at L = 2 over 20
   steps, whichever design), so once the pipeline is full the rate is gamma^L / step_s.
3. The time to the run's worth of progress (S steps of an on-policy run): the first step fills
   the pipeline (its rollout, training and sync, nothing overlapped: a split's trainer waits for
   its first batch on fewer devices, 72 s against colocate's 32 s on training_heavy; and the
   L + 1 steps admitted at the start share the rollout, `pipeline_fill_s`), then
   S / gamma^L - 1 steps: T = fill + (S / gamma^L - 1) x step_s. (Ranked by rate alone, a short
   run chose a split that reached the target 1.5x later than colocate at the same step time.)
4. The ranking is by T, least first; ties go to the earlier candidate: less lag, and at the same
   lag and layout finish-order batches before step batches.

`scheduler/design_planner.py` re-checks the choice once the run has measured its own lengths.

Invariants (tests/scheduler/test_design.py): every candidate's role map validates and its lag is
within the bounds; gamma = 1 makes the rate the inverse step time; a dear lag puts on-policy
colocate first; a cheaper lag never ranks a laggier design lower; the pipeline's fill counts once
and matters less the longer the run; a finish-order batch waits for a shorter sample the more lag
it allows; a long tail is worth dropping the batch barrier for; without a tail and with heavy
training a colocated design wins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.costmodel import CostModel
from scheduler.layout import VALID_TP, Bucket, RoleMap, colocated_role_map
from scheduler.layout_model import LayoutModel, Scales, Workload
from scheduler.layout_search import LayoutSearch
from scheduler.planner import PlannerConfig

# Measured 2026-12-06 on this project's 2-core CPU machines, the trainer's default (decoupled) objective:
#   python -m bench.convergence --lags 0,1,2,4 --seeds 8 --steps 30  (tiny policy, digit task, lr 2e-2, target 0.8):
#     steps to target 8.4 / 9.8 / 10.2 / 12.5 at lags 0 / 1 / 2 / 4 -> gamma 0.878
#   python -m bench.convergence --model smollm2 --lags 0,1,2,4 --seeds 2 --steps 12 --target 0.5 (lr 1e-5):
#     5.5 / 7.0 / 6.5 / >= 7.0 -> gamma 0.895 (2 seeds: noisy)
# (bypass, verl's objective, fitted 0.69 on the tiny policy: it is not what the simulated systems train with)
MEASURED_LAG_GAMMA = 0.88
MEASURED_LAG_SOURCE = "bench.convergence --lags 0,1,2,4 (decoupled PPO): tiny 0.878 (8 seeds), SmolLM2 0.895 (2 seeds)"

LAG_BOUNDS = (0, 1, 2, 4)  # trained-lag bounds the planner may choose (0: on-policy), the peers' range
DESIGN_FAMILIES = ("libra", "libra-partial", "colocate", "libra-hybrid")  # the SYSTEMS entries a design runs as


@dataclass(frozen=True)
class Design:
    system: str  # the SYSTEMS entry that runs it: libra, libra-partial, colocate, libra-hybrid
    lag: int  # the lookahead / trained-lag bound (the run's max_staleness; 0 = on-policy)
    role_map: RoleMap  # its first layout (a split's planner re-plans it)
    step_s: float  # predicted step time on the sample, once the pipeline is full
    fill_s: float  # predicted first step: its rollout, training and sync, nothing overlapped yet
    gamma: float  # the worth of a trajectory trained one version late
    # finish-order: the trained-lag bound, above its lag (a group the batches pass over is trained by then; the
    # step core's `bound_trained_lag`); None: the lag bounds it
    trained_lag_bound: int | None = None

    @property
    def rate(self) -> float:
        """Progress per second once the pipeline is full: gamma^lag / step_s."""
        return self.gamma ** self.lag / self.step_s

    def time_for(self, steps: int, *, filled: bool = False) -> float:
        """Seconds to make `steps` on-policy steps' worth of progress: the first step fills the pipeline,
        each later one adds gamma^lag of a step (`filled`: the pipeline is already running)."""
        need = steps / self.gamma ** self.lag
        return need * self.step_s if filled else self.fill_s + max(0.0, need - 1) * self.step_s

    @property
    def lookahead(self) -> int:
        """Steps the core admits ahead of the trainer: the lag bound in every design (colocate's 0 included)."""
        return self.lag

    @property
    def max_staleness(self) -> int:
        """The staleness bound the step core runs it at: a finish-order design's trained-lag bound, else its lag,
        at least 1 (colocate's lookahead 0 admits nothing ahead, so nothing trains stale there anyway)."""
        return self.trained_lag_bound if self.trained_lag_bound is not None else max(1, self.lag)

    @property
    def batch_by_finish(self) -> bool:
        """A batch is the first complete groups to finish (finish-order's), not a step's trajectories (every other
        design's; leaving finish order drains the groups in flight first: `StepCore.set_design`)."""
        return self.system == "libra-partial"

    @property
    def label(self) -> str:
        rm = self.role_map
        layout = f"colocated TP{rm.instances[0].tp}" if rm.colocated else rm.describe(version=False)
        return f"{self.system} lag={self.lag} ({layout})"


@dataclass(frozen=True, kw_only=True)
class DesignSpace:
    """What the choice may use: the machine, its model, the rollout buckets and engine limits."""

    world_size: int
    buckets: tuple[Bucket, ...]  # the split's heterogeneous buckets
    allowed_tp: tuple[int, ...] = VALID_TP
    max_batch: int = 128  # sequences per instance (the engine's max_batch)
    lag_bounds: tuple[int, ...] = LAG_BOUNDS
    gamma: float = MEASURED_LAG_GAMMA
    group_size: int = 8  # GRPO samples per prompt: a finish-order batch is complete groups
    families: tuple[str, ...] = DESIGN_FAMILIES  # the designs allowed
    bound_trained_lag: bool = True  # finish-order designs bound the trained lag at `lag_cap`; False: admission only
    lag_cap: int | None = None  # the run's staleness bound, a finish-order design's trained-lag bound (None: max(lag_bounds))

    def __post_init__(self) -> None:
        if self.world_size < 2:
            raise ValueError(f"DesignSpace: world_size={self.world_size} must be >= 2")
        if not self.lag_bounds or min(self.lag_bounds) < 0:
            raise ValueError(f"DesignSpace: lag_bounds={self.lag_bounds} must be non-empty and >= 0, e.g. (0, 1, 2, 4)")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"DesignSpace: gamma={self.gamma} must be in (0, 1]; 1 prices staleness at nothing")


def design_lag_cap(planner: PlannerConfig, max_staleness: int) -> int:
    """The largest lag bound libra's design may take: `planner.max_lag` where set (a comparison gives libra the lag
    range its tuned peers get), else the run's staleness bound, the user's."""
    return planner.max_lag if planner.max_lag is not None else max_staleness


def design_space(*, world_size: int, buckets: tuple[Bucket, ...], planner: PlannerConfig, max_staleness: int,
                 group_size: int, gamma: float = MEASURED_LAG_GAMMA) -> DesignSpace:
    """What libra's planner may choose among on this run: lag bounds up to `design_lag_cap` (the planner may
    choose less lag, never more), `planner.design` the families it allows."""
    cap = design_lag_cap(planner, max_staleness)
    return DesignSpace(world_size=world_size, buckets=buckets, allowed_tp=planner.allowed_tp, max_batch=planner.max_batch,
                       gamma=gamma, group_size=group_size, lag_bounds=tuple(x for x in LAG_BOUNDS if x <= cap),
                       families=DESIGN_FAMILIES if planner.design == "auto" else (planner.design,),
                       bound_trained_lag=planner.bound_trained_lag, lag_cap=cap)


def cap_prior(prompt_tokens: Sequence[int], *, max_turns: int, max_new_tokens_per_turn: int, max_tool_tokens: int,
              max_total_tokens: int, trajectories_per_step: int) -> Workload:
    """What a real run knows of its lengths before step 1: its tasks' prompts and its generation caps. Each
    trajectory is taken to run to them: every one of `max_turns` turns decodes `max_new_tokens_per_turn` and
    every turn but the last brings a tool output of `max_tool_tokens`, all within `max_total_tokens`; its
    first tool output comes after its first turn. An upper bound: where the policy stops early it overrates
    the lengths, and the design planner's first check on measured lengths corrects it."""
    if not prompt_tokens:
        raise ValueError("cap_prior: no prompt lengths; give the token counts of a few of the run's task prompts")
    lengths, signals, decoded = [], [], 0
    for p in prompt_tokens:
        total = min(max_total_tokens, p + max_turns * max_new_tokens_per_turn + (max_turns - 1) * max_tool_tokens)
        lengths.append(max(1, total))
        signals.append(min(total, p + max_new_tokens_per_turn) if max_turns > 1 else total)
        decoded += min(max(0, total - p), max_turns * max_new_tokens_per_turn)
    return Workload(trajectory_tokens=tuple(lengths), num_trajectories=trajectories_per_step,
                    train_tokens=sum(lengths) / len(lengths) * trajectories_per_step,
                    decode_frac=min(1.0, max(1e-3, decoded / sum(lengths))), signal_tokens=tuple(signals))


def finish_order_sample(wl: Workload, lag: int, group_size: int) -> Workload:
    """The length sample as a finish-order batch sees it: with L + 1 steps' groups in flight (the newest
    started a step late and overtakes little), a batch is about the first 1/L of the others to complete,
    and a group completes with its slowest sample, so the batch waits for trajectories up to the quantile
    (1/L)^(1/n) of the lengths (n the group size); longer ones carry on into later batches: capped there
    (their work still counts, in the throughput of the whole sample)."""
    q = (1.0 / max(1, lag)) ** (1.0 / max(1, group_size))
    lens = sorted(wl.trajectory_tokens)
    cap = lens[min(len(lens) - 1, int(q * len(lens)))]
    return dataclasses.replace(wl, trajectory_tokens=tuple(min(x, cap) for x in wl.trajectory_tokens),
                               signal_tokens=tuple(min(x, cap) for x in wl.signal_tokens))


def pipeline_fill_s(choice, step_throughput_s: float, lag: int) -> float:
    """A split's first step: at the start L + 1 steps are admitted at once and share the rollout, so the first batch
    comes in after its own rollout's makespan or the instances' time for L + 1 steps' work, whichever is longer; then
    it trains and syncs (nothing overlapped). Simulated 16-device swe, a finish-order split at lag 2 on one TP4
    instance: its first step took 553 s, against 480 s priced without the shared start (3 x 196.5 s: 590 s)."""
    return max(choice.rollout_s, (lag + 1) * step_throughput_s) + choice.train_s + choice.sync_s


def _split_designs(cm: CostModel, space: DesignSpace, wl: Workload):
    min_tp, min_train = cm.min_rollout_tp(), cm.min_train_devices()
    # a finish-order design's trained-lag bound: the largest the run allows (None: admission only, any lag)
    bound = (max(space.lag_bounds) if space.lag_cap is None else space.lag_cap) if space.bound_trained_lag else None
    for lag in (x for x in space.lag_bounds if x >= 1):
        search = LayoutSearch(cm, space.world_size, space.buckets, allowed_tp=space.allowed_tp,
                              max_batch=space.max_batch, min_tp=min_tp, min_train=min_train, lookahead=lag)
        # finish-order: the split searched for the batch it waits for (`finish_order_sample`); L + 1 steps'
        # groups decode together (no barrier holds admission back), so each instance runs a larger batch,
        # at a better rate per sequence: the whole sample's throughput at that width, per step. Only below the
        # trained-lag bound: at it, a batch would wait for every group of the step the bound reaches (a barrier).
        # Finish-order first: at the same lag it waits for less than step batches (a tie goes to it)
        if bound is None or lag < bound:
            wide = dataclasses.replace(wl, num_trajectories=wl.num_trajectories * (lag + 1))
            capped = finish_order_sample(wl, lag, space.group_size)
            part = search.best(capped, Scales(), current=None, floor=(wide, lag + 1))
            rm = search.build(part, None)
            thr_wide = search.throughput_s(rm, wide) / (lag + 1)
            yield ("libra-partial", lag, rm, max(part.step_s, thr_wide),
                   pipeline_fill_s(part, search.throughput_s(rm, capped), lag), bound)
        choice = search.best(wl, Scales(), current=None, floor=(wl, 1))
        rm = search.build(choice, None)
        thr = search.throughput_s(rm, wl)
        # batches in flight together share the rollout devices: no lookahead beats their throughput
        yield "libra", lag, rm, max(choice.step_s, thr), pipeline_fill_s(choice, thr, lag), None


def colocated_parts(cm: CostModel, space: DesignSpace, wl: Workload, tp: int) -> tuple[float, float, float, float]:
    """A colocated TP-`tp` layout on `wl`: (a batch's rollout, alone on every rank; the instances' time for its
    work at full throughput; training on every rank; the local weight sync)."""
    single = (dataclasses.replace(space.buckets[-1], max_tokens=None),)
    model = LayoutModel(cm, single, max_batch=space.max_batch, lookahead=0)
    rm = colocated_role_map(world_size=space.world_size, tp=tp)
    _, rollout, train = model.predict(rm, wl, Scales())
    return rollout, model.throughput_s(rm, wl), train, cm.sync_s(space.world_size, space.world_size, colocated=True)


def _colocated_designs(cm: CostModel, space: DesignSpace, wl: Workload):
    g = space.world_size
    tps = [t for t in space.allowed_tp if g % t == 0 and t >= cm.min_rollout_tp() and cm.model.tp_divides(t)]
    if not cm.host_fits(g, g):  # every rank holds a trainer shard and a rollout model
        return
    for tp in tps:
        rm = colocated_role_map(world_size=g, tp=tp)
        rollout, thr, train, sync = colocated_parts(cm, space, wl, tp)
        if 0 in space.lag_bounds:
            yield "colocate", 0, rm, rollout + train + sync, rollout + train + sync, None
        if 1 in space.lag_bounds:
            yield "libra-hybrid", 1, rm, train + sync + max(thr, rollout / 2), rollout + train + sync, None


def rank_designs(cm: CostModel, space: DesignSpace, wl: Workload, steps: int) -> list[Design]:
    """Every candidate design with its predicted step times, first to `steps` steps' worth of progress first
    (module docstring)."""
    splits = _split_designs(cm, space, wl) if {"libra", "libra-partial"} & set(space.families) else ()  # searches
    out = [Design(system=s, lag=lag, role_map=rm, step_s=step_s, fill_s=fill_s, gamma=space.gamma, trained_lag_bound=bound)
           for s, lag, rm, step_s, fill_s, bound in (*splits, *_colocated_designs(cm, space, wl))
           if s in space.families]
    if not out:
        finish_order = (" (finish-order batches run below the largest lag allowed, their trained-lag bound: allow 2 with "
                        "--step.max-staleness 2 or --planner.max-lag 2, or bound admission only with "
                        "--planner.bound-trained-lag false)") if space.families == ("libra-partial",) else ""
        raise ValueError(f"rank_designs: no design of {space.families} fits lag_bounds={space.lag_bounds} and allowed_tp="
                         f"{space.allowed_tp} on {space.world_size} ranks{finish_order}; allow lag 1 or a TP that divides "
                         "the world size")
    return [d for _, d in sorted(enumerate(out), key=lambda x: (x[1].time_for(steps), x[0]))]
