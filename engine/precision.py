"""Numeric precision per device: what the rollout holds and what the trainer computes in.

  - CPU: everything float32 by default (the CPU tests compare exact values); `--rollout.dtype
    bfloat16` loads the rollout model in bf16 on CPUs with bf16 matmul (avx512_bf16 or AMX),
    and is refused on the others, where bf16 decode is slower than float32.
  - CUDA / NPU: the rollout model is loaded in bfloat16 (half the memory and bandwidth of the
    decode loop); the trainer keeps float32 master weights and optimizer state and computes in
    bfloat16: FSDP2 `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)` when sharded
    (gradients are reduced in fp32), `torch.autocast(bf16)` on a single trainer rank.
  - The weight sync sends the rollout's dtype (the sender casts each bucket), so the manifests of
    both sides agree and half the bytes move; log-probs are always taken in float32.

Invariants (tests/engine/test_precision.py): the decision per device kind and rollout dtype; autocast on a CPU trainer
is never entered; a sender casting to bf16 is received by a bf16 model's manifest.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Precision:
    rollout_dtype: torch.dtype  # dtype of the rollout model and of the weights sent to it
    master_dtype: torch.dtype  # trainer parameters and optimizer state
    compute_dtype: torch.dtype  # trainer forward/backward
    reduce_dtype: torch.dtype  # FSDP2 gradient reduction

    @property
    def mixed(self) -> bool:
        return self.compute_dtype != self.master_dtype


def precision_for(device_type: str, rollout_dtype: str = "auto") -> Precision:
    """`rollout_dtype` (--rollout.dtype): auto (bf16 on accelerators, fp32 on CPU), float32 or bfloat16."""
    accelerator = device_type in ("cuda", "npu")
    rollout = {"auto": torch.bfloat16 if accelerator else torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16}[rollout_dtype]
    if rollout == torch.bfloat16 and not accelerator and not cpu_has_bf16_matmul():
        raise RuntimeError("--rollout.dtype bfloat16: this CPU has no bf16 matmul (avx512_bf16 or AMX), so bf16 decode "
                           "would be slower than float32; use --rollout.dtype float32")
    if accelerator:
        return Precision(rollout, torch.float32, torch.bfloat16, torch.float32)
    return Precision(rollout, torch.float32, torch.float32, torch.float32)


def cpu_has_bf16_matmul() -> bool:
    return bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())


def fsdp_mp_policy(p: Precision):
    """The FSDP2 mixed-precision policy, or None for full precision."""
    if not p.mixed:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=p.compute_dtype, reduce_dtype=p.reduce_dtype)


def autocast(p: Precision, device_type: str):
    """Context for an unsharded trainer's forward: bf16 autocast on accelerators, nothing on CPU."""
    if not p.mixed:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=p.compute_dtype)
