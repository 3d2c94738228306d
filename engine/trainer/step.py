"""One GRPO step's math that every rank working on the step runs alike: trainer ranks and elastic helpers.

`plan_step` (no communication, the same on every rank from the same list): trajectories cut to `max_tokens`,
GRPO advantages per group, the micro-batch plan over the step's slots (trainer ranks, then helpers), the
whole step's loss denominators, and whether the step carries any signal. `micro_batch_loss`: one
micro-batch's PPO-clip loss with its off-policy terms (`off_policy_terms`) and KL, as its share of the
step's loss. engine/trainer/trainer.py runs them on its ranks; engine/trainer/elastic.py on a helper.

Invariants (tests/engine/trainer/test_trainer.py, test_elastic.py): the plan covers every trajectory exactly
once; micro-batches and slots sum to the full-batch loss; stale tokens are weighted exactly by
pi_prox / pi_behave (decoupled) or clipped against their recorded log-probs (bypass).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import torch

from engine.trainer.algos import LOG_RATIO_CLAMP, group_advantages, kl_penalty, ppo_clip_loss
from engine.trainer.batch import plan_micro_batches
from engine.trainer.config import TrainerConfig
from engine.trajectory import Trajectory


def trajectory_advantages(trajectories: list[Trajectory], *, normalize_std: bool, eps: float) -> list[float]:
    """One advantage per trajectory, normalised within its `group_id` (groups may differ in size)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, traj in enumerate(trajectories):
        if traj.reward is None:
            raise ValueError(f"trajectory {traj.request_id} has reward=None; score (or drop) it before training")
        groups[traj.group_id].append(i)
    advantages = [0.0] * len(trajectories)
    for members in groups.values():
        rewards = torch.tensor([[float(trajectories[i].reward) for i in members]])
        for i, a in zip(members, group_advantages(rewards, normalize_std=normalize_std, eps=eps)[0].tolist()):
            advantages[i] = a
    return advantages


@dataclass(frozen=True)
class StepPlan:
    """What every rank that works on a step derives alike from the same list (trainer ranks and helpers)."""

    trajectories: list  # cut to max_tokens
    advantages: list[float]
    plan: list  # plan[slot][micro] = indices into `trajectories`; slots: the trainer ranks, then the helpers
    denoms: dict  # the whole step's loss denominators, so micro-batches and slots sum to the full-batch loss
    signal: bool  # False: every advantage is 0 (and no KL): the step's gradient is exactly zero
    truncated: int  # trajectories cut to max_tokens


def plan_step(trajectories: list[Trajectory], cfg: TrainerConfig, num_slots: int) -> StepPlan:
    """Steps 1-2 of the module docstring for `num_slots` ranks: no communication, the same on every rank."""
    cap = cfg.max_tokens
    # the rollout cuts tool output to its budget; a trajectory over it anyway (another producer, a bug)
    # must not be what runs the trainer out of memory: cut, not trained past the budget, counted
    truncated = sum(t.num_tokens > cap for t in trajectories) if cap else 0
    if truncated:
        trajectories = [t.truncated(cap) for t in trajectories]
    advantages = trajectory_advantages(trajectories, normalize_std=cfg.normalize_std, eps=cfg.adv_eps)
    # Position 0 is never a target, so count model tokens from position 1 on.
    seq_tokens = [sum(t.loss_mask[1:]) for t in trajectories]
    signal = cfg.kl_coef != 0 or any(a != 0.0 and n > 0 for a, n in zip(advantages, seq_tokens))
    plan = plan_micro_batches([t.num_tokens for t in trajectories], num_slots, cfg.micro_batch_tokens,
                              packed=cfg.pack_sequences) if signal else []
    denoms = {"num_tokens": max(sum(seq_tokens), 1), "num_seqs": max(sum(1 for n in seq_tokens if n), 1)}
    return StepPlan(list(trajectories), advantages, plan, denoms, signal, truncated)


def off_policy_terms(current: torch.Tensor, batch: dict[str, torch.Tensor], policy_version: int,
                     cfg: TrainerConfig) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
    """(old log-probs, behaviour weight or None, stale-token stats) of one micro-batch (module docstring, 4.).

    The stats describe the stale tokens' true behaviour weights pi_current / pi_behave under
    every objective, so that runs with different objectives report the same quantity."""
    recorded = batch["old_logprobs"]
    stale = (batch["versions"] < policy_version) & (batch["mask"] > 0)
    mode = cfg.off_policy
    # clamped like the PPO log-ratio: a weight of e^20 is over any cap anyway
    true_weight = torch.exp(torch.clamp(current - recorded, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    capped = stale & (true_weight > cfg.behaviour_weight_cap) if mode == "decoupled" else torch.zeros_like(stale)
    stale_weights = true_weight[stale]
    stats = {"stale_tokens": float(stale.sum()), "behaviour_weight_sum": float(stale_weights.sum()),
             "behaviour_weight_max": float(stale_weights.max()) if stale_weights.numel() else 0.0,
             "behaviour_capped_tokens": float(capped.sum())}
    if mode == "recompute-all":
        return current, None, stats
    if mode == "bypass":
        return recorded, None, stats
    old = torch.where(stale, current, recorded)
    if mode == "recompute":
        return old, None, stats
    weight = torch.where(stale & ~capped, true_weight, torch.zeros_like(true_weight))
    return old, torch.where(stale, weight, torch.ones_like(weight)), stats


def micro_batch_loss(logprobs: torch.Tensor, batch: dict[str, torch.Tensor], cfg: TrainerConfig, policy_version: int,
                     denoms: dict, ref_logprobs: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one micro-batch as its share of the step's (global denominators) and its metrics (step 3)."""
    mask = batch["mask"]
    old, weight, stats = off_policy_terms(logprobs.detach(), batch, policy_version, cfg)
    agg = dict(aggregation=cfg.aggregation, **denoms)
    dual = cfg.clip_ratio_c if math.isfinite(cfg.clip_ratio_c) else None
    pg_loss, pg_metrics = ppo_clip_loss(logprobs, old, batch["advantages"], mask, cfg.clip_low, cfg.clip_high,
                                        clip_ratio_c=dual, behaviour_weight=weight, **agg)
    loss = pg_loss
    kl = torch.zeros(())
    if ref_logprobs is not None:
        kl = kl_penalty(logprobs, ref_logprobs, mask, cfg.kl_kind, **agg)
        loss = loss + cfg.kl_coef * kl
    out = {"loss": loss.item(), "pg_loss": pg_loss.item(), "kl": kl.item(), **stats}
    out.update({k: v.item() for k, v in pg_metrics.items()})
    return loss, out


def add_metrics(sums: dict[str, float], part: dict[str, float]) -> None:
    """Sum a micro-batch's metrics into the step's (`*_max` keys: the maximum)."""
    for key, value in part.items():
        sums[key] = max(sums.get(key, value), value) if key.endswith("_max") else sums.get(key, 0.0) + value
