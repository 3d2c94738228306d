"""GRPO tensor math: group advantages, token log-probs (whole or chunked), PPO-clip loss (with the
off-policy behaviour weight of the decoupled objective and dual-clip), KL penalty.

Pure functions over tensors: no process groups, no models, no optimizer. The trainer
(`engine/trainer/trainer.py`) feeds them micro-batches and passes the *global* denominators (tokens or
sequences of the whole step across all trainer ranks), so that summing the micro-batch losses
over micro-batches and ranks gives exactly the loss of one full-batch computation.

Algorithm (one GRPO step, per token t of sequence i with advantage A_i):
  1. A_i = (r_i - mean(r_group)) / (std(r_group) + eps), or without the division (Dr. GRPO
     style); std is the unbiased sample std; a group of one or of rewards equal within
     `REWARD_TOL` gives A = 0 exactly (float32 rounding of 8 x 0.7 would otherwise give +-0.056,
     and Adam turns any nonzero gradient into a full step of lr).
  2. log_ratio = clamp(logp - logp_old, -20, 20) (verl's clamp: one wild token cannot overflow);
     ratio = exp(log_ratio); per-token loss = max(-A * ratio, -A * clip(ratio, 1 - clip_low,
     1 + clip_high)) (asymmetric bounds allowed, DAPO "clip-higher"); for A < 0 also at most
     -A * clip_ratio_c (dual-clip, c = 3: a token far above the ratio bound cannot make an unbounded
     loss).
  3. Off-policy tokens (decoupled PPO, AReaL): logp_old is the proximal policy's and each token's
     loss is multiplied by its behaviour weight w = pi_prox / pi_behave (a detached tensor the
     caller builds, 0 on tokens whose weight exceeds the cap). Tokens without a weight use 1.
  4. Aggregate over the loss mask: "token-mean" = sum(loss * mask) / num_tokens, or
     "seq-mean-token-mean" = mean over sequences of each sequence's masked token mean. A capped
     token still counts in the denominator (AReaL): dropping it must not scale the others up.
  5. KL to a reference (k1, k2 or k3 estimator of Schulman), aggregated the same way; for k3 the
     log difference is clamped to [-20, 20] and the estimate to at most 10, as verl clamps it.

Invariants (tests/engine/trainer/test_algos.py, hand-computed values): equal-reward groups (0.1, 0.7, 1/3 x 8)
and empty masks give exactly 0 and never NaN; masked positions never influence the loss or its
gradient; splitting a batch into parts and passing the global denominators reproduces the
full-batch loss; chunked log-probs equal the whole-logits ones in value and gradient for any chunk
size; the decoupled loss, dual-clip and the clamps equal formulas written out in the test.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch import Tensor

from engine.trainer.config import AGGREGATIONS, KL_KINDS

REWARD_TOL = 1e-6  # rewards of one group closer than this (relative to max(1, |r|)) are equal: A = 0
LOG_RATIO_CLAMP = 20.0  # |log pi - log pi_old| and |log pi - log pi_ref| beyond this are clamped (verl)
K3_MAX = 10.0  # the k3 KL estimate of one token is at most this (verl)


def group_advantages(rewards: Tensor, normalize_std: bool = True, eps: float = 1e-6) -> Tensor:
    """Advantages [num_groups, n] from rewards [num_groups, n], normalised within each group."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards has shape {tuple(rewards.shape)}, expected [num_groups, n]; reshape the flat rewards by group first")
    rewards = rewards.to(torch.float64)  # float32 means of 0.1 or 1/3 are off by an ulp that std then magnifies
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    # A group whose rewards are equal (to rounding) carries no signal: exactly 0, not rounding noise.
    spread = rewards.amax(dim=1, keepdim=True) - rewards.amin(dim=1, keepdim=True)
    flat = spread <= REWARD_TOL * rewards.abs().amax(dim=1, keepdim=True).clamp(min=1.0)
    centred = torch.where(flat, torch.zeros_like(centred), centred)
    if normalize_std and rewards.shape[1] >= 2:  # a group of one has no spread: its centred value is 0
        centred = centred / (rewards.std(dim=1, keepdim=True, unbiased=True) + eps)
    return centred.to(torch.float32)


def token_logprobs(logits: Tensor, target_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """log p(target_ids[..., t] | logits[..., t, :]) in float32, same shape as target_ids."""
    logits = logits.to(torch.float32)
    if temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def _linear_token_logprobs(hidden: Tensor, weight: Tensor, bias: Tensor | None, target_ids: Tensor,
                           temperature: float) -> Tensor:
    return token_logprobs(torch.nn.functional.linear(hidden, weight, bias), target_ids, temperature)


def chunked_token_logprobs(hidden: Tensor, weight: Tensor, target_ids: Tensor, *, temperature: float = 1.0,
                           chunk_tokens: int = 1024, bias: Tensor | None = None) -> Tensor:
    """`token_logprobs(hidden @ weight.T + bias, target_ids)` without a full-vocabulary logits tensor.

    hidden [..., T, H], weight [V, H], target_ids [..., T] -> float32 log-probs [..., T]. The
    tokens go through the output layer `chunk_tokens` at a time; under autograd each chunk is
    checkpointed, so backward recomputes one chunk's logits at a time instead of keeping every
    chunk's: the peak is ~3 x chunk_tokens x V floats, not 3 x T x V (at a 151,936-token
    vocabulary that is 1.8 GB per 1k tokens in float32).
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens} must be >= 1; use ~512 (0 in the config means unchunked)")
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = target_ids.reshape(-1)
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    parts = []
    for start in range(0, flat_targets.numel(), chunk_tokens):
        args = (flat_hidden[start:start + chunk_tokens], weight, bias, flat_targets[start:start + chunk_tokens], temperature)
        if grad:
            parts.append(torch.utils.checkpoint.checkpoint(_linear_token_logprobs, *args, use_reentrant=False))
        else:
            parts.append(_linear_token_logprobs(*args))
    if not parts:
        return torch.zeros(target_ids.shape, dtype=torch.float32, device=hidden.device)
    return torch.cat(parts).view(target_ids.shape)


def masked_aggregate(
    values: Tensor,
    mask: Tensor,
    aggregation: str = "token-mean",
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> Tensor:
    """Reduce per-token `values` [B, T] over `mask` [B, T] to a scalar.

    `num_tokens` / `num_seqs` are the denominators of the whole step (all micro-batches, all
    ranks); they default to this batch's own counts. An empty mask gives 0.
    """
    mask = mask.to(values.dtype)
    masked = values * mask
    if aggregation == "token-mean":
        denom = mask.sum() if num_tokens is None else torch.tensor(float(num_tokens), device=values.device)
        return masked.sum() / denom.clamp(min=1.0)
    if aggregation == "seq-mean-token-mean":
        seq_tokens = mask.sum(dim=-1)
        seq_means = masked.sum(dim=-1) / seq_tokens.clamp(min=1.0)
        # Sequences without a model token carry no signal and do not dilute the mean.
        denom = (seq_tokens > 0).sum().to(values.dtype) if num_seqs is None else torch.tensor(float(num_seqs), device=values.device)
        return seq_means.sum() / denom.clamp(min=1.0)
    raise ValueError(f"aggregation={aggregation!r} is unknown; use one of {AGGREGATIONS}")


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: str = "token-mean",
    *,
    clip_ratio_c: float | None = 3.0,
    behaviour_weight: Tensor | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip policy loss over masked tokens; returns (loss, metrics).

    `advantages` is per sequence [B] or per token [B, T]. `clip_ratio_c`: the dual-clip bound on
    tokens with A < 0 (None: off). `behaviour_weight` [B, T] (detached; decoupled PPO): each token's
    loss is multiplied by it. Metrics (detached, aggregated like the loss): `clip_frac` (tokens where
    the clipped branch is taken), `dual_clip_frac`, `approx_kl` (mean of logp_old - logp), `ratio_mean`.
    """
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c={clip_ratio_c} must be > 1 (dual-clip bound, e.g. 3.0) or None")
    if advantages.dim() == logprobs.dim() - 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(logprobs.dtype)
    mask = mask.to(logprobs.dtype)
    # Masked positions may hold garbage old log-probs (padding, inf): select, not multiply, so
    # neither exp() overflow nor inf * 0 can turn into NaN.
    log_ratio = torch.where(mask > 0, logprobs - old_logprobs, torch.zeros_like(logprobs))
    log_ratio = torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    dual_on = torch.zeros_like(per_token, dtype=torch.bool)
    if clip_ratio_c is not None:
        bound = -advantages * clip_ratio_c  # > 0 where A < 0: the most one token may cost
        dual_on = (advantages < 0) & (per_token > bound)
        per_token = torch.where(dual_on, bound.expand_as(per_token), per_token)
    if behaviour_weight is not None:
        per_token = per_token * behaviour_weight
    loss = masked_aggregate(per_token, mask, aggregation, num_tokens=num_tokens, num_seqs=num_seqs)
    with torch.no_grad():
        clip_on = (clipped > unclipped).to(logprobs.dtype)
        agg = dict(aggregation=aggregation, num_tokens=num_tokens, num_seqs=num_seqs)
        metrics = {
            "clip_frac": masked_aggregate(clip_on, mask, **agg),
            "dual_clip_frac": masked_aggregate(dual_on.to(logprobs.dtype), mask, **agg),
            "approx_kl": masked_aggregate(-log_ratio, mask, **agg),
            "ratio_mean": masked_aggregate(ratio, mask, **agg),
        }
    return loss, metrics


def kl_penalty(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    kind: str = "k3",
    aggregation: str = "token-mean",
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> Tensor:
    """Estimate of KL(policy || reference) from sampled tokens, aggregated over the mask.

    k1 = logp - logp_ref; k2 = (logp - logp_ref)^2 / 2; k3 = exp(d) - d - 1 with d = logp_ref -
    logp (unbiased and always >= 0). For k3, d is clamped to [-20, 20] and the estimate to at most
    10, as verl does, so one wild token can neither overflow nor dominate the step.
    """
    diff = torch.where(mask > 0, logprobs - ref_logprobs, torch.zeros_like(logprobs))
    if kind == "k1":
        per_token = diff
    elif kind == "k2":
        per_token = 0.5 * diff.square()
    elif kind == "k3":
        d = torch.clamp(-diff, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        per_token = torch.clamp(torch.exp(d) - d - 1.0, max=K3_MAX)
    else:
        raise ValueError(f"kind={kind!r} is unknown; use one of {KL_KINDS}")
    return masked_aggregate(per_token, mask, aggregation, num_tokens=num_tokens, num_seqs=num_seqs)
