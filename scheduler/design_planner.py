"""Libra's planner over designs: the design in force, re-chosen once the run has measured its lengths.

Before step 1 the design comes from the bench's prior (`scheduler/design.py` ranks the designs);
a prior can misjudge a workload (no tail where the bench has one, short trajectories, heavy
training). So the design is checked against the run's own sample:

Algorithm (`DesignPlanner.on_step_end`):
1. Within a design, its own planner re-plans (a split's `GlobalPlanner`; a colocated design
   has none) and its forecast is the one the rows report.
2. At the first length sample (`min_history_trajectories` finished trajectories, as the split
   planner's first re-plan) every design is ranked on the measured workload. The best one replaces the design in force when the time it takes to make
   the progress of the steps left (less those already admitted), with its pipeline fill and the
   switch's cost, beats the current design's (already filled, and scaled by how far its own
   measured steps were from the model: `measured_scale`, the model priced on those steps' own
   lengths) by `min_gain_ratio`. (Priced on the history's mean lengths instead, a finish-order split on
   the default swe preset, seed 1, whose lengths grew, looked 1.33x its price and moved to a hybrid:
   2,335 s to the target against 2,123 s staying.) The switch's
   cost: `planner.switch_cost_s`, as the split planner prices a switch; the new design's first step refills the pipeline (leaving
   finish-order batches first drains the groups in flight, `StepCore.set_design`: that bubble is
   the refill's). The current design's figure comes from the same ranking: its
   system and lag, and for a colocated one its TP (a split's is its planner's best split, which
   it would move to anyway).
   `--planner.design FAMILY` allows that family only: the run moves to its best design at the
   first check whatever the price (an ablation, and how a real run is made to switch in tests).
3. One more check once the design in force has run `MEASURED_ENDS` steps: its periods after the
   first now calibrate it (the first step alone misjudged a finish-order split by 20%: its fill
   was as predicted, its later steps 1.26x), two of them at least: a time-shared hybrid alternates
   long and short steps (heavy_tail: 464 and 98 s), and a single period scaled its forecast by its
   length alone (the mean forecast error there 1.42 -> 1.10 with two; and on 48 x A800 search a
   finish-order split's one period with a trained-lag wait in it moved the run to step batches,
   0.70 of the best peer against 0.96). Then no more: drift within a design is its planner's to follow.
   A colocated design has no planner within, so after each step it forecasts the next one itself
   (a split's planner does the same, `GlobalPlanner`): from the last batch's lengths (under drift
   the best guess: on length_drift, whose trajectories triple, the second check's 793 s stayed the
   forecast while the steps grew to 2,500 s) and from where the pipeline stands: the next batch has
   generated `StepStats.ahead_s` already, so the step is its training and sync plus what is left of
   its rollout. A time-shared hybrid's steps alternate (heavy_tail: 465 and 98 s): a batch admitted
   a step ahead runs through a long step and is nearly done by the next training, which makes the
   step after it short; the mean step the ranking prices was off at every step. The model's rollout
   and training are calibrated as a split's planner calibrates them (`Scales`, EMAs of measured over
   predicted): a step's rollout is its period less its training and sync, plus the head start its
   batch had (measured only where the rollout, not the training, ended the step).
4. Which idle rollout instances help train a batch (`elastic_helpers`) is scheduler/elastic.py's
   decision on the planner's cost model, whatever the design (a colocated one has no idle instance).

Invariants (tests/scheduler/test_design_planner.py): no switch before the first length sample,
at most two checks; a colocated design forecasts its steps too, following its lengths and the
next batch's head start; the measured scale prices the measured steps on their own lengths; a switch that
cannot pay for itself in the steps left is refused; the decision carries the new design's
lookahead, staleness bound and batching, and a validated role map.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable

from scheduler.api import PlanDecision, StepStats
from scheduler.costmodel import CostModel
from scheduler.design import Design, DesignSpace, colocated_parts, rank_designs
from scheduler.elastic import elastic_helpers
from scheduler.layout import RoleMap
from scheduler.layout_model import Scales, Workload
from scheduler.layout_search import switch_of
from scheduler.planner import PlannerConfig, switch_cost_s

logger = logging.getLogger(__name__)
MEASURED_ENDS = 4  # step ends on a design before its periods (the first is its fill; two periods) calibrate it

def same_design(a: Design, b: Design) -> bool:
    """The same system and lag, and for a colocated layout the same TP (a split's layout is its planner's to change)."""
    if (a.system, a.lag) != (b.system, b.lag):
        return False
    return not a.role_map.colocated or a.role_map.instances[0].tp == b.role_map.instances[0].tp


class DesignPlanner:
    """Implements the `Planner` protocol of scheduler/api.py for libra (module docstring)."""

    def __init__(self, cm: CostModel, space: DesignSpace, design: Design, remaining_steps: int, *,
                 cfg: PlannerConfig | None, planner_for: Callable[[Design, int], object | None], lookahead: int) -> None:
        """`planner_for(design, remaining_steps)`: the planner within a design (None for a colocated one);
        `lookahead`: the steps the core admits ahead of the trainer on the design in force."""
        self.cm, self.space, self.cfg = cm, space, cfg or PlannerConfig()
        self.design, self.remaining_steps, self.lookahead = design, remaining_steps, lookahead
        self._planner_for = planner_for
        self.inner = planner_for(design, remaining_steps)
        self._history: list[StepStats] = []
        self._ends: list[float] = []  # when each step of the design in force ended (its measured periods)
        self.checks = 0  # re-checks made (module docstring, 2-3)
        self._design_step_s = design.step_s if math.isfinite(design.step_s) else None
        self._notes: list[str] = []  # what its checks concluded (`take_notes`)
        self._scales, self._ahead_s = Scales(), 0.0  # a colocated design's calibration; the last step's head start

    @property
    def forecast_step_s(self) -> float | None:
        """The split planner's forecast within a split design; else the design's own: its ranking's step time on the
        lengths seen until the first check, then the next step from where the pipeline stands (`_reforecast`). None
        before a step has ended: a row's forecast is made at the end of the step before (docs/design.md), and before
        step 1 there are only the bench's prior lengths (training_heavy's were ten times its own: step 1 forecast
        at 10x its time)."""
        if not self._history:
            return None
        inner = self.inner.forecast_step_s if self.inner is not None else None
        return inner if inner is not None else self._design_step_s

    def on_step_end(self, stats: StepStats, now: float) -> PlanDecision | None:
        self.remaining_steps -= 1
        self._history = (self._history + [stats])[-self.cfg.history_steps:]
        self._ends.append(now)
        sampled = sum(len(s.trajectory_tokens) for s in self._history) >= self.cfg.min_history_trajectories
        head, self._ahead_s = self._ahead_s, stats.ahead_s  # how long this step's batch had run when the last ended
        if sampled and (self.checks == 0 or self.checks == 1 and len(self._ends) >= MEASURED_ENDS):
            self.checks += 1
            decision = self._rechoose(stats)
            if decision is not None:
                return decision
        if self.inner is None and self.checks:
            self._reforecast(stats, head)
        return self.inner.on_step_end(stats, now) if self.inner is not None else None

    def take_notes(self) -> list[str]:
        """What the design checks and the split planner within concluded since the last call, in plain words."""
        notes, self._notes = self._notes, []
        return notes + (self.inner.take_notes() if self.inner is not None else [])

    def elastic_helpers(self, num_tokens: int, role_map: RoleMap, candidates: tuple[int, ...]) -> tuple[int, ...]:
        """Which idle rollout instances (`candidates`, offered by the step core) help train a batch of `num_tokens`."""
        return elastic_helpers(self.cm, num_tokens, len(role_map.trainer_ranks), candidates)

    def _say(self, note: str) -> None:
        logger.info("planner %s", note)
        self._notes.append(note)

    def measured_scale(self, current: Design) -> float:
        """Measured over predicted time of the design in force: its steps after the first against its step time on
        those steps' lengths (`_step_on`), else its first step (rollout, training and sync, nothing overlapped)
        against its fill."""
        if len(self._ends) >= MEASURED_ENDS:
            periods = [b - a for a, b in zip(self._ends[1:], self._ends[2:])]
            measured, predicted = sum(periods) / len(periods), self._step_on(current, self._history[-len(periods):])
        else:
            first = self._history[0]
            measured, predicted = first.rollout_s + first.train_s + first.sync_s, current.fill_s
        return min(2.0, max(0.5, measured / predicted)) if measured > 0 and predicted > 0 else 1.0

    def _step_on(self, design: Design, steps: list[StepStats]) -> float:
        """`design`'s step time priced on the lengths of `steps` (those whose periods were measured: under drift the
        history's mean lengths are not theirs, and the ratio would count the drift as the model's error)."""
        if not any(s.trajectory_tokens for s in steps):
            return design.step_s
        space = dataclasses.replace(self.space, families=(design.system,))
        ranked = rank_designs(self.cm, space, Workload.from_stats(steps), max(1, self.remaining_steps))
        return next((d.step_s for d in ranked if same_design(d, design)), design.step_s)

    def _reforecast(self, stats: StepStats, head: float) -> None:
        """The next step of the colocated design in force: its training and sync, and the rest of a rollout that has
        run `stats.ahead_s` already, on the last batch's lengths, as calibrated (module docstring, 3); `head`: the
        head start that batch had."""
        recent = [stats] if stats.trajectory_tokens else self._history  # under drift the last batch is the best guess
        rollout, _, train, sync = colocated_parts(self.cm, self.space, Workload.from_stats(recent),
                                                  self.design.role_map.instances[0].tp)
        if stats.trajectory_tokens:  # calibrated on the step's own batch
            generated = self._ends[-1] - self._ends[-2] - stats.train_s - stats.sync_s if len(self._ends) >= 2 else 0.0
            ended_by_rollout = generated > 0.05 * stats.train_s  # else the training ended the step: no rollout measured
            self._scales.observe(self.cfg.scale_ema, rollout=(generated + head, rollout) if ended_by_rollout else None,
                                 train=(stats.train_s, train))
        self._design_step_s = (train * self._scales.train + sync
                               + max(0.0, rollout * self._scales.rollout - stats.ahead_s))

    def _rechoose(self, stats: StepStats) -> PlanDecision | None:
        wl = Workload.from_stats(self._history)
        steps = max(0, self.remaining_steps - self.lookahead)  # run on whatever design is chosen now
        if steps == 0:
            self._say(f"kept the design {self.design.label}: no step is left for another to pay back in")
            return None
        ranked = rank_designs(self.cm, self.space, wl, max(1, steps))
        current = next((d for d in ranked if same_design(d, self.design)), None)  # None: a family not allowed
        best = ranked[0]
        scale = self.measured_scale(current) if current is not None else 1.0
        if current is not None:
            self._design_step_s = current.step_s * scale
            if same_design(best, current):
                self._say(f"kept the design {current.label}: the first to the reward target on the lengths measured "
                          f"({self._design_step_s:.1f} s a step on average predicted)")
                return None
        switch = switch_of(stats.role_map or self.design.role_map, best.role_map)
        cost = switch_cost_s(self.cm, switch, self.space.world_size)
        # the design in force is none the planner may keep (`--planner.design` names another): it moves
        stay = current.time_for(steps, filled=True) * scale if current is not None else math.inf  # as measured
        move = best.time_for(steps) + cost  # a switch refills the pipeline
        if stay < move * (1 + self.cfg.min_gain_ratio):
            self._say(f"kept the design {self.design.label}: {best.label} would take {move:.1f} s for the progress of "
                      f"the {steps} step(s) left (the switch's {cost:.1f} s included), against {stay:.1f} s")
            return None
        reason = (f"{move:.1f} s for the progress of the {steps} step(s) left (the switch's {cost:.1f} s and a pipeline "
                  f"fill included), against {stay:.1f} s on {self.design.label}" if current is not None else
                  f"as --planner.design {best.system} asks (from {self.design.label})")
        self._say(f"moved to the design {best.label}: {reason}")
        self.design, self.lookahead, self._ends = best, best.lookahead, []
        self._scales, self._ahead_s = Scales(), 0.0
        self._design_step_s = best.step_s
        self.inner = self._planner_for(best, self.remaining_steps)
        return PlanDecision(role_map=best.role_map, predicted_step_s=best.step_s,
                            current_step_s=current.step_s if current is not None else math.nan,
                            reconfig_s=cost, reason=reason, details={"design": best.label},
                            lookahead=best.lookahead, max_staleness=best.max_staleness,
                            batch_by_finish=best.batch_by_finish)
