"""The trainer's config, torch-free so that `config.py` (and `--help`, `--sim`) never import torch.

The option tuples live here too (the trainer's math in `engine/trainer/algos.py` and its validation
both read them). Invariants (tests/engine/trainer/test_trainer.py): every bad value raises ValueError naming
the field, the constraint and the fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

AGGREGATIONS = ("token-mean", "seq-mean-token-mean")
KL_KINDS = ("k1", "k2", "k3")
# How tokens older than the trainer's version are trained (fresh tokens always use their recorded log-probs):
#   decoupled      AReaL's decoupled PPO: ratio to the proximal (current) policy times the capped behaviour weight
#   bypass         verl's async recipes: the recorded behaviour log-probs as old, clipped, no weight
#   recompute      the current policy's own log-probs as old: ratio 1, no clip, no weight (Libra before issue 31)
#   recompute-all  as recompute for every token, fresh ones too (checks that carry no recorded log-probs)
OFF_POLICY_OBJECTIVES = ("decoupled", "bypass", "recompute", "recompute-all")
ACTIVATION_CHECKPOINTING = ("auto", "on", "off")


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    lr: float = 1e-5  # AdamW learning rate
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW moment decay rates
    adam_eps: float = 1e-8  # AdamW denominator epsilon
    grad_clip: float = 1.0  # max global L2 norm of the gradient (inf: measure, never clip)
    clip_low: float = 0.2  # PPO ratio lower bound is 1 - clip_low
    clip_high: float = 0.2  # PPO ratio upper bound is 1 + clip_high (DAPO clip-higher: 0.28)
    kl_coef: float = 0.0  # weight of the KL penalty to the initial policy (0: no reference model)
    kl_kind: str = "k3"  # KL estimator: k1, k2 or k3
    normalize_std: bool = True  # divide group-centred rewards by the group std (False: Dr. GRPO)
    adv_eps: float = 1e-6  # added to the group std before dividing
    aggregation: str = "token-mean"  # loss reduction over tokens: token-mean | seq-mean-token-mean
    micro_batch_tokens: int = 4096  # tokens per forward/backward (packed: sum of lengths; padded: sequences x longest)
    pack_sequences: bool = True  # lay a micro-batch's sequences end to end in one row instead of padding them
    logprob_chunk_tokens: int = 512  # tokens per pass through the output layer for log-probs (0: whole logits at once)
    activation_checkpointing: str = "auto"  # recompute layer activations in backward: on | off | auto (on on GPU/NPU)
    off_policy: str = "decoupled"  # objective for stale tokens: decoupled | bypass | recompute | recompute-all
    behaviour_weight_cap: float = 5.0  # decoupled: a stale token whose pi_prox / pi_behave exceeds this is masked (inf: none)
    clip_ratio_c: float = 3.0  # dual-clip: a token with A < 0 costs at most -A * this (inf: off)
    max_nonfinite_steps: int = 3  # stop the run after this many steps in a row with a NaN/inf loss or gradient
    max_tokens: int = 0  # a longer trajectory is cut to this many tokens before training, counted in the row (0: no cut)
    max_staleness: int | None = 1  # refuse tokens generated more than this many versions ago (None: bounded at admission)
    temperature: float = 1.0  # the rollout's sampling temperature: log-probs are taken at it

    def __post_init__(self):
        if not (math.isfinite(self.lr) and 0 < self.lr <= 1.0):
            raise ValueError(f"lr={self.lr} must be a finite number in (0, 1]; use e.g. 1e-6..1e-4 for a pretrained policy")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay={self.weight_decay} must be >= 0; use 0.0 to disable it")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas={self.betas} must be two values in [0, 1); use (0.9, 0.999)")
        if not self.adam_eps > 0:
            raise ValueError(f"adam_eps={self.adam_eps} must be > 0; use 1e-8")
        if not self.grad_clip > 0:
            raise ValueError(f"grad_clip={self.grad_clip} must be > 0; use float('inf') to measure without clipping")
        if not (0.0 <= self.clip_low < 1.0 and self.clip_high >= 0.0):
            raise ValueError(f"clip_low={self.clip_low}, clip_high={self.clip_high} need 0 <= clip_low < 1 and clip_high >= 0; use 0.2 and 0.2 (or 0.28)")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef={self.kl_coef} must be >= 0; use 0.0 to train without a reference model")
        if self.kl_kind not in KL_KINDS:
            raise ValueError(f"kl_kind={self.kl_kind!r} is unknown; use one of {KL_KINDS}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation={self.aggregation!r} is unknown; use one of {AGGREGATIONS}")
        if self.micro_batch_tokens < 2:
            raise ValueError(f"micro_batch_tokens={self.micro_batch_tokens} must be >= 2; use a few thousand")
        if self.logprob_chunk_tokens < 0:
            raise ValueError(f"logprob_chunk_tokens={self.logprob_chunk_tokens} must be >= 0; use ~512, or 0 for whole logits")
        if self.activation_checkpointing not in ACTIVATION_CHECKPOINTING:
            raise ValueError(f"activation_checkpointing={self.activation_checkpointing!r} is unknown; use one of {ACTIVATION_CHECKPOINTING}")
        if self.off_policy not in OFF_POLICY_OBJECTIVES:
            raise ValueError(f"off_policy={self.off_policy!r} is unknown; use one of {OFF_POLICY_OBJECTIVES}")
        if not self.behaviour_weight_cap > 1.0:
            raise ValueError(f"behaviour_weight_cap={self.behaviour_weight_cap} must be > 1; use 5.0, or inf to keep every token")
        if not self.clip_ratio_c > 1.0:
            raise ValueError(f"clip_ratio_c={self.clip_ratio_c} must be > 1; use 3.0, or inf to turn dual-clip off")
        if self.max_nonfinite_steps < 1:
            raise ValueError(f"max_nonfinite_steps={self.max_nonfinite_steps} must be >= 1; use 3")
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens={self.max_tokens} must be >= 0; pass the rollout's max_total_tokens, or 0 for no cut")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"max_staleness={self.max_staleness} must be >= 0; use 0 for on-policy or 1 for one-step async")
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature} must be > 0; pass the rollout's sampling temperature")
