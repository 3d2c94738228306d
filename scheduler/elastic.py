"""Which idle rollout instances join a training step (the paper's elastic hybrid pool).

When the step core hands the trainer a batch, a TP1 rollout instance with nothing to run may
compute gradients on a slice of it with the weights it already holds (under one-step lookahead,
the trainer's pre-step weights) and hand them to the trainer ranks, which sum them into their
step; the trainer's FSDP group is never rebuilt. The step core offers the idle instances
(`StepCore.take_batch`); this module decides which of them join, with the cost model's
`elastic_train_s` (the batch split evenly by tokens over k trainer ranks + h helpers, then the
float32 gradient hand-off over the link).

Algorithm (`elastic_helpers`): none where a helper's device cannot hold a gradient beside its
weights (`CostModel.helper_fits`); else add the candidates in id order while each one makes the
update more than `MIN_GAIN_FRAC` faster than it was, and stop at the first that does not (the
split's gain per helper shrinks, its hand-off grows once helpers outnumber the trainer ranks).

Invariants (tests/scheduler/test_scheduler_elastic.py): the chosen ids are a prefix of the sorted
candidates; no candidate joins a batch without tokens, nor where the hand-off over a slow link
costs more than the split saves; every helper added made the predicted update faster.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.costmodel import CostModel
from scheduler.layout import RoleMap

MIN_GAIN_FRAC = 0.02  # a helper joins only if the update gets this much faster (the model's error is larger than that)


def elastic_helpers(cost: CostModel, num_tokens: int, num_trainer: int, candidates: Iterable[int]) -> tuple[int, ...]:
    """The candidates (rollout instance ids) that join training `num_tokens` tokens on `num_trainer` ranks."""
    ids = sorted(candidates)
    if num_tokens <= 0 or not ids or not cost.helper_fits():
        return ()
    chosen: list[int] = []
    current = cost.elastic_train_s(num_tokens, num_trainer, 0)
    for instance_id in ids:
        with_it = cost.elastic_train_s(num_tokens, num_trainer, len(chosen) + 1)
        if not with_it < current * (1.0 - MIN_GAIN_FRAC):
            break
        chosen.append(instance_id)
        current = with_it
    return tuple(chosen)


def idle_tp1_instances(role_map: RoleMap, busy: set) -> tuple[int, ...]:
    """The TP1 rollout instances of `role_map` on no trainer rank whose id is not in `busy`, sorted: the ones a
    batch may borrow (a TP instance's model is sharded; an instance on a trainer rank trains already)."""
    trainer = set(role_map.trainer_ranks)
    return tuple(sorted(i.instance_id for i in role_map.instances
                        if i.tp == 1 and i.ranks[0] not in trainer and i.instance_id not in busy))


def planner_helpers(planner, num_tokens: int, role_map: RoleMap, candidates: tuple[int, ...]) -> tuple[int, ...]:
    """The `candidates` a planner lets join a batch of `num_tokens` (its `elastic_helpers`), sorted; none without
    candidates or a planner that decides it."""
    choose = getattr(planner, "elastic_helpers", None)
    if choose is None or not candidates:
        return ()
    chosen = tuple(sorted(choose(num_tokens, role_map, candidates)))
    assert set(chosen) <= set(candidates), f"the planner chose helpers {chosen} outside the idle instances {candidates}"
    return chosen
