"""Global resource planner: when to re-plan the split of G devices, and whether a new plan is worth it.

Inputs: the world size G, the cost model, the rollout buckets, and each step's `StepStats`.
Output: a validated `RoleMap` inside a `PlanDecision`, or None. What the best layout is for a
workload lives in `scheduler/layout_model.py` (the model) and `scheduler/layout_search.py` (the search).

Algorithm, per `on_step_end(stats, now)`:
1. History: the last `history_steps` steps. The `settle_steps` steps after the start or a
   switch (the pipeline filling, mixed layouts) neither calibrate nor trigger, unless their
   rollout/train ratio is more than 2x outside `ratio_band` (overlap cannot explain that).
2. Calibration: `Scales` (rollout, train) are EMAs of measured/predicted times on the layout that
   ran; rollout is a batch's critical path (admission to last finish), what the model predicts
   before the pipeline overlaps batches (`layout_model.pipeline_step_s`).
3. Trigger: as soon as `min_history_trajectories` trajectories have finished (the first layout
   was chosen before any length was seen), then every `interval_steps` steps, or at once when
   rollout per step (the critical path, at most the step period) / train leaves `ratio_band`;
   never before that first sample; a skipped trainer step (train_s = 0) measures nothing.
4. On a ratio trigger the search only considers splits that do not take ranks from the stage
   the clock says is short (an uncalibrated model can contradict the clock; the buckets may
   still be re-planned at the same split). Apply only if current/new >= 1 + `min_gain_ratio`
   and the gain per step x the steps left that run on the new layout exceeds the reconfiguration
   cost. Those steps are the ones admitted after the switch: the run's remaining steps less the
   `lookahead` already admitted, whose rollout ran on the old layout (so with one step left and a
   pipeline one step ahead, no move pays). The cost: the cost model's (a profile's: hand-off save,
   rebuild, new trainers loaded, one sync), or the dearest change this run has measured
   (`StepStats.reconfig_s`), whichever is more. No tool drain: a request in a tool call moves at once.
5. A cost model that cannot price moving ranks between training and rollout (`prices_split`
   False: the analytic tables on a CPU run, whose ranks share cores) keeps the split; the
   planner says so once and still re-plans the buckets.
6. After each step it forecasts the next one on the layout in force (`forecast_step_s`: the
   recent workload, as calibrated, times the model's level: `period_scale`, an EMA of each
   measured period over the forecast made for it, on a settled layout); the step core writes that
   forecast into the next step's row beside the measured `step_s`, and the summary says how far
   off it was on average. (Without the level, a finish-order split's forecast ran 1.2-1.3x its
   steps: its rollout scale is calibrated on the batch's span from its oldest group's admission,
   which the period does not follow; `forecast_mean_err` 0.11-0.26 on the paper presets, 0.00-0.09
   with it.) The level prices a switch's gain in measured seconds too; the choice of layout, a
   ratio of two of the model's steps, does not depend on it.
7. When the step core hands out a batch it asks which idle rollout instances help train it
   (`elastic_helpers`: scheduler/elastic.py's decision on this planner's cost model).

Invariants (tests/scheduler/test_scheduler_planner.py): every plan validates for any G in 2..1024 (ranks
add up, TP in {1,2,4,8}, both stages non-empty); rollout-heavy history gets more rollout devices
than training-heavy history; a long tail gets an instance of TP >= 2; on stationary input a
second plan never replaces the first (hysteresis); no re-plan from too little history; settling
steps leave the calibration alone and trigger only far outside the band; no plan takes ranks
from the measured bottleneck; a gain that cannot pay for the switch (as modelled, or as measured
by an earlier switch) over the steps admitted after it is refused; a split the cost model cannot
price is kept; the step model counts the pipeline's overlap; the forecast follows the measured periods' level and
that level moves no layout.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

from scheduler.api import PlanDecision, StepStats
from scheduler.costmodel import CostModel
from scheduler.elastic import elastic_helpers
from scheduler.layout import MAX_SEQS_PER_INSTANCE, VALID_TP, BucketsConfig, RoleMap
from scheduler.layout_model import Scales, Workload
from scheduler.layout_search import Choice, LayoutSearch, Switch, switch_of

__all__ = ["GlobalPlanner", "PlannerConfig", "Workload"]
logger = logging.getLogger(__name__)
DESIGN_CHOICES = ("auto", "libra", "libra-partial", "colocate", "libra-hybrid")  # PlannerConfig.design: scheduler/design.py's families
FIRST_DESIGNS = ("prior", "split")  # PlannerConfig.first_design
PROFILE_MODES = ("auto", "refresh", "none", "")  # PlannerConfig.profile values that are not a path ("": none, as before)


@dataclass(frozen=True, kw_only=True)
class PlannerConfig:
    interval_steps: int = 10  # K: re-plan every K steps
    ratio_band: tuple[float, float] = (0.8, 1.25)  # re-plan at once if rollout_s/train_s leaves this band
    min_gain_ratio: float = 0.05  # apply a plan only if current/new step time >= 1 + this
    allowed_tp: tuple[int, ...] = VALID_TP  # TP degrees a rollout instance may have
    heterogeneous: bool = True  # False: one unbounded bucket, one TP degree
    allow_realloc: bool = True  # False: keep the trainer/rollout split, re-plan the buckets only
    history_steps: int = 8  # steps of history the workload is built from
    check_memory: bool = True  # respect the cost model's minimum rollout TP and trainer size
    scale_ema: float = 0.5  # weight of the newest measured/predicted time ratio
    max_batch: int = MAX_SEQS_PER_INSTANCE  # most sequences one instance decodes at once, whatever its TP (a run: the engine's)
    min_history_trajectories: int = 128  # finished trajectories before the first re-plan (the length sample)
    settle_steps: int = 1  # steps after a layout change (or the start) that neither calibrate nor trigger
    design: str = "auto"  # libra's design (scheduler/design.py): auto = the planner's choice, or a family it moves to at its first length sample: libra (split), libra-partial (finish-order), colocate, libra-hybrid
    max_lag: int | None = None  # the largest trained-lag bound libra's design may choose (scheduler/design.py LAG_BOUNDS); None: the run's --step.max-staleness
    bound_trained_lag: bool = True  # libra's finish-order designs train no group past that bound (a batch waits for it); False: they bound admission only, as AReaL (faster where the tail spans many steps)
    first_design: str = "prior"  # libra before step 1: prior = its design ranked on the tasks' prompts at the generation caps | split = the launcher's split
    profile: str = "auto"  # auto: plan a CPU run on this machine's costs, measured once (~1 min) and cached | refresh | none: analytic tables | a bench.profile JSON

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
        if self.max_batch < 1:
            raise ValueError(f"PlannerConfig: max_batch={self.max_batch} must be >= 1, e.g. 256 (vLLM's max_num_seqs)")
        if self.min_history_trajectories < 1 or self.settle_steps < 0:
            raise ValueError(f"PlannerConfig: min_history_trajectories={self.min_history_trajectories} must be >= 1 "
                             f"and settle_steps={self.settle_steps} >= 0; e.g. 3 and 1")
        if not 0 < self.scale_ema <= 1:
            raise ValueError(f"PlannerConfig: scale_ema={self.scale_ema} must be in (0, 1]")
        if self.design not in DESIGN_CHOICES:
            raise ValueError(f"PlannerConfig: design={self.design!r} is none of {DESIGN_CHOICES}; auto lets the planner choose")
        if self.max_lag is not None and self.max_lag < 0:
            raise ValueError(f"PlannerConfig: max_lag={self.max_lag} must be >= 0 (0: on-policy designs only), or None for "
                             "the run's --step.max-staleness")
        if self.first_design not in FIRST_DESIGNS:
            raise ValueError(f"PlannerConfig: first_design={self.first_design!r} is none of {FIRST_DESIGNS}; prior chooses "
                             "libra's design before step 1, split starts on the launcher's split")
        if self.profile not in PROFILE_MODES and not Path(self.profile).is_file():
            raise ValueError(f"PlannerConfig: profile {self.profile!r} does not exist and is none of {PROFILE_MODES[:3]}; "
                             f"pass auto, or write one with `python -m bench.profile --model M --out {self.profile}`")


def switch_cost_s(cm: CostModel, switch: Switch, world_size: int) -> float:
    """What a switch is expected to cost: the model's figure for its kind; nothing when no rank moves.

    No drain: a request in a tool call leaves its instance at once and its new instance re-issues the call
    (engine/runtime/once.py runs it once), so a switch never waits for a tool. One being scored finishes
    first; what that costs shows in the measured `StepStats.reconfig_s`, which the planner charges too."""
    if not switch.moved:
        return 0.0
    # every rank keeps running through a switch (rollout decodes on): on shared cores it is slower
    return cm.reconfig_s(switch.moved, switch.trainer_moved, busy_ranks=world_size)


class GlobalPlanner:
    def __init__(self, cfg: PlannerConfig | None, cost_model: CostModel, world_size: int, remaining_steps: int,
                 current: RoleMap | None = None, buckets: BucketsConfig | None = None, lookahead: int = 1) -> None:
        """`lookahead`: batches the step core admits ahead of the trainer (0: synchronous)."""
        if world_size < 2:
            raise ValueError(f"GlobalPlanner: world_size={world_size} must be >= 2 (one trainer + one rollout device)")
        self.cfg, self.cm, self.world_size = cfg or PlannerConfig(), cost_model, world_size
        self.remaining_steps = remaining_steps
        self.lookahead = lookahead
        self.current = current
        self.scales = Scales()
        self.period_scale = 1.0  # measured period over the model's step, as calibrated (`_calibrate_period`)
        buckets = buckets or BucketsConfig()
        check = self.cfg.check_memory
        self.search = LayoutSearch(cost_model, world_size, buckets.buckets() if self.cfg.heterogeneous else buckets.single(),
                                   allowed_tp=self.cfg.allowed_tp, max_batch=self.cfg.max_batch,
                                   min_tp=cost_model.min_rollout_tp() if check else 1,
                                   min_train=cost_model.min_train_devices() if check else 1, lookahead=lookahead,
                                   check_host=check)
        self._history: list[StepStats] = []
        self._steps_since_plan = 0
        self._steps_on_layout = 0  # steps since the layout last changed (or since the start)
        self._last_now: float | None = None
        self._sampled = False  # a plan has been weighed on a measured length sample
        # the dearest role-map change this run has paid, by whether it moved the trainer group
        self.measured_reconfig_s: dict[bool, float] = {True: 0.0, False: 0.0}
        self._switch: Switch | None = None  # the last plan's change, until its measured cost arrives
        self.prices_split = cost_model.prices_split  # False: keep the split (module docstring, 5)
        self._said_unpriced = False
        self.forecast_step_s: float | None = None  # the next step's time on the layout in force (module docstring, 6)
        self._notes: list[str] = []  # what each check concluded (`take_notes`; the step core takes them every step)

    @property
    def rollout_scale(self) -> float:
        return self.scales.rollout

    @property
    def train_scale(self) -> float:
        return self.scales.train

    # ---- public ------------------------------------------------------------------------------
    def plan(self, history: Workload | list[StepStats]) -> PlanDecision:
        """Best plan for `history`, applied unconditionally (the initial plan)."""
        wl = history if isinstance(history, Workload) else Workload.from_stats(history)
        best = self._best(wl)
        role_map = self.search.build(best, self.current)
        cur_s = self.search.predict(self.current, wl, self.scales)[0] if self.current else best.step_s
        switch = switch_of(self.current, role_map)
        self.current, self._steps_since_plan, self._steps_on_layout, self._sampled = role_map, 0, 0, True
        self._switch = switch
        return self._decision(best, role_map, cur_s, switch, "initial plan")

    def on_step_end(self, stats: StepStats, now: float) -> PlanDecision | None:
        self._calibrate_period(stats, now)
        decision = self._on_step_end(stats, now)
        self.forecast_step_s = self._forecast()
        return decision

    def _calibrate_period(self, stats: StepStats, now: float) -> None:
        """The step model's level: the measured period over the forecast made for it (EMA), on a settled layout."""
        forecast, last = self.forecast_step_s, self._last_now
        settled = self._steps_on_layout >= self.cfg.settle_steps and stats.reconfig_s == 0
        if forecast and last is not None and now > last and settled:
            raw = forecast / self.period_scale
            self.period_scale += self.cfg.scale_ema * (min(10.0, max(0.1, (now - last) / raw)) - self.period_scale)

    def take_notes(self) -> list[str]:
        """What the checks since the last call concluded, in plain words: a layout kept and why, or a move."""
        notes, self._notes = self._notes, []
        return notes

    def elastic_helpers(self, num_tokens: int, role_map: RoleMap, candidates: tuple[int, ...]) -> tuple[int, ...]:
        """Which idle rollout instances (`candidates`, offered by the step core) help train a batch of `num_tokens`."""
        return elastic_helpers(self.cm, num_tokens, len(role_map.trainer_ranks), candidates)

    def _forecast(self) -> float | None:
        """The step time the model predicts for the layout in force on the recent workload, as calibrated."""
        if self.current is None or self.current.colocated or not any(s.trajectory_tokens for s in self._history):
            return None
        return self.search.predict(self.current, Workload.from_stats(self._history), self.scales)[0] * self.period_scale

    def _on_step_end(self, stats: StepStats, now: float) -> PlanDecision | None:
        self.remaining_steps -= 1
        self._steps_since_plan += 1
        self._steps_on_layout += 1
        self._history = (self._history + [stats])[-self.cfg.history_steps:]
        if stats.reconfig_s > 0:  # the cost of the switch this planner made (unknown: the dearer kind)
            kind = self._switch.trainer_moved if self._switch is not None else True
            self.measured_reconfig_s[kind] = max(self.measured_reconfig_s[kind], stats.reconfig_s)
            self._switch = None
        settled = self._steps_on_layout > self.cfg.settle_steps  # a filling pipeline or a switch mixes loads
        rollout_s = self.rollout_per_step_s(stats, now)
        if settled:
            self._calibrate(stats)
        ratio = rollout_s / stats.train_s if stats.train_s > 0 else math.nan  # no training time: no measurement
        lo, hi = self.cfg.ratio_band
        drift = stats.train_s > 0 and not lo <= ratio <= hi
        far = not lo / 2 <= ratio <= 2 * hi  # two overlapping batches can at most double a batch's rollout
        if sum(len(s.trajectory_tokens) for s in self._history) < self.cfg.min_history_trajectories:
            return None  # too small a length sample misjudges the tail
        first = not self._sampled  # the first layout was a guess made before any length was seen
        if self._steps_since_plan < self.cfg.interval_steps and not (drift and (settled or far)) and not first:
            return None
        if not any(s.trajectory_tokens for s in self._history):
            return None
        self._steps_since_plan, self._sampled = 0, True
        wl = Workload.from_stats(self._history)
        if self.current is None:
            return self.plan(wl)
        believed = drift and (settled or far)  # a filling pipeline's ratio says nothing about the bottleneck
        starved = ("rollout" if ratio > hi else "train") if believed else None  # the stage the clock says is short
        why = " outside band" if believed else " first length sample" if first else " periodic"
        return self._maybe_apply(wl, f"ratio={ratio:.2f}" + why, starved)

    def rollout_per_step_s(self, stats: StepStats, now: float) -> float:
        """Rollout seconds one step costs the pipeline: the batch's critical path, at most the step period.

        When rollout is the bottleneck, batch j+1 is admitted while batch j still runs, so each
        batch's admission-to-finish span covers about two periods of shared devices."""
        last, self._last_now = self._last_now, now
        period = now - last if last is not None else math.inf
        if period < stats.train_s:  # shorter than the training it contains: not a real clock (tests pass step numbers)
            return stats.rollout_s
        return min(stats.rollout_s, period)

    # ---- decisions ---------------------------------------------------------------------------
    def _best(self, wl: Workload, starved: str | None = None) -> Choice:
        """The best layout; the split is kept without realloc, and never shrinks the `starved` stage."""
        lo, hi = 1, self.world_size - 1
        if self.current is not None:
            cur = len(self.current.rollout_ranks)
            if not self.cfg.allow_realloc or not self.prices_split:
                lo = hi = cur
            elif starved == "rollout":
                lo = cur
            elif starved == "train":
                hi = cur
        return self.search.best(wl, self.scales, current=self.current, rollout_range=(lo, hi))

    def _maybe_apply(self, wl: Workload, why: str, starved: str | None = None) -> PlanDecision | None:
        if not self.prices_split and not self._said_unpriced and self.cfg.allow_realloc:
            self._said_unpriced = True
            logger.info("planner keeps the trainer/rollout split: the cost model cannot price moving ranks between "
                        "them (the analytic tables on shared CPU cores); --planner.profile auto measures this machine")
            self._notes.append("kept the trainer/rollout split: the analytic cost tables cannot price a move "
                               "on shared CPU cores (--planner.profile auto measures this machine)")
        best = self._best(wl, starved)
        cur_s = self.search.predict(self.current, wl, self.scales)[0]
        role_map = self.search.build(best, self.current)
        switch = switch_of(self.current, role_map)
        current = self.current.describe(version=False)
        if switch.moved == 0:
            logger.debug("plan kept (%s): the best layout is the current one (%.3fs)", why, cur_s)
            self._notes.append(f"kept {current}: the best layout for the lengths measured ({cur_s:.1f} s a step predicted)")
            return None
        reconfig, steps = self.reconfig_s(switch), self.payback_steps()
        gain = (cur_s - best.step_s) * self.period_scale  # in measured seconds
        if cur_s < best.step_s * (1 + self.cfg.min_gain_ratio) or gain * steps <= reconfig:
            new = role_map.describe(version=False)
            note = f"kept {current}: " + (
                "no step is left for a switch to pay back in" if steps == 0 else
                f"{new} would save {gain:.1f} s a step, {gain * steps:.1f} s over the {steps} step(s) left, "
                f"against the switch's {reconfig:.1f} s" if gain > 0 else
                f"{new} would be no faster ({best.step_s:.1f} s a step against {cur_s:.1f} s)")
            self._notes.append(note)
            logger.info("planner %s (%s)", note, why.strip())
            return None
        self.current, self._steps_on_layout, self._switch = role_map, 0, switch
        return self._decision(best, role_map, cur_s, switch, why, f"; the switch's {reconfig:.1f}s paid back over {steps} step(s)")

    def payback_steps(self) -> int:
        """Steps that would run wholly on a layout switched to now: the remaining steps less those the
        pipeline has already admitted (`lookahead`), whose rollout runs on the current layout."""
        return max(0, self.remaining_steps - self.lookahead)

    def reconfig_s(self, switch: Switch) -> float:
        """`switch_cost_s`, at least what a change of that kind cost here."""
        if not switch.moved:
            return 0.0
        return max(switch_cost_s(self.cm, switch, self.world_size),
                   self.measured_reconfig_s[switch.trainer_moved])

    def _calibrate(self, stats: StepStats) -> None:
        rm = stats.role_map or self.current
        if rm is None or rm.colocated or not stats.trajectory_tokens:
            return
        _, pred_r, pred_t = self.search.predict(rm, Workload.from_stats([stats]), Scales())
        self.scales.observe(self.cfg.scale_ema, rollout=(stats.rollout_s, pred_r), train=(stats.train_s, pred_t))

    def _decision(self, c: Choice, rm: RoleMap, cur_s: float, switch: Switch, why: str, payback: str = "") -> PlanDecision:
        details = {"rollout_s": c.rollout_s, "train_s": c.train_s, "sync_s": c.sync_s,
                   "num_trainer": len(rm.trainer_ranks), "train_layout": f"fsdp{len(rm.trainer_ranks)}",
                   "num_moved": switch.moved, "rollout_scale": self.scales.rollout, "train_scale": self.scales.train}
        reason = f"{why}: {rm.describe()} predicted {c.step_s:.3f}s vs {cur_s:.3f}s{payback}"
        logger.info("planner %s", reason)
        self._notes.append(f"moved to {rm.describe(version=False)} ({why.strip()}): {c.step_s:.1f} s a step predicted "
                           f"against {cur_s:.1f} s{payback}")
        return PlanDecision(role_map=rm, predicted_step_s=c.step_s, current_step_s=cur_s,
                            reconfig_s=self.reconfig_s(switch), reason=reason, details=details)
