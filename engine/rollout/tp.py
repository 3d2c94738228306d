"""Tensor parallelism for a rollout instance: shard a Llama/Qwen-style model over a TP subgroup.

Algorithm:
  1. Build a 1-D `DeviceMesh` from the instance's TP process group (`DeviceMesh.from_group`),
     so the same code runs on gloo (CPU), nccl (CUDA) and hccl (NPU).
  2. Per decoder layer, `parallelize_module` with the Megatron split: q/k/v and gate/up are
     `ColwiseParallel` (each rank holds heads/k attention heads and 1/k of the MLP), o_proj and
     down_proj are `RowwiseParallel` (one all-reduce each). Embeddings, norms and lm_head stay
     replicated, so every rank ends with the full logits.
  3. `load_full_weights` copies full (unsharded) tensors from the trainer into the local shards,
     with no communication: every rank slices its own chunk.

Invariants (tests/engine/rollout/test_tp.py): TP=2 on gloo gives the logits of TP=1 within 1e-4; after
`load_full_weights` the sharded model equals the full model the weights came from.
"""

from __future__ import annotations

import logging

import torch
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

log = logging.getLogger(__name__)

LAYER_PLAN = {
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}


def check_tp_degree(config, tp_degree: int) -> None:
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", config.num_attention_heads)
    if heads % tp_degree or kv_heads % tp_degree or config.intermediate_size % tp_degree:
        raise ValueError(
            f"TP degree {tp_degree} must divide attention heads ({heads}), kv heads ({kv_heads}) and "
            f"intermediate size ({config.intermediate_size}); pick a bucket layout with TP degrees that divide them"
        )


def parallelize(model, tp_group, *, device_type: str = "cpu"):
    """Shard `model` in place over `tp_group` (every rank of the group calls this); returns it."""
    world = torch.distributed.get_world_size(tp_group)
    check_tp_degree(model.config, world)
    mesh = DeviceMesh.from_group(tp_group, device_type=device_type)
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    for layer in model.model.layers:
        parallelize_module(layer, mesh, {name: styles[kind]() for name, kind in LAYER_PLAN.items()})
    log.info("[libra tp] sharded %d layers over a TP group of %d", len(model.model.layers), world)
    return model


@torch.no_grad()
def load_full_weights(model, named_tensors: dict[str, torch.Tensor]) -> None:
    """Copy full tensors into `model`, slicing this rank's shard where a parameter is a DTensor."""
    params = dict(model.named_parameters())
    params.update(dict(model.named_buffers()))
    for name, full in named_tensors.items():
        if name not in params:
            if name == "lm_head.weight" and getattr(model.config, "tie_word_embeddings", False):
                continue
            raise ValueError(f"weight {name!r} is not a parameter of the rollout model; send names of the same architecture")
        param = params[name]
        if isinstance(param, DTensor):
            local = full
            mesh = param.device_mesh
            for dim_i, placement in enumerate(param.placements):
                if isinstance(placement, Shard):
                    local = local.chunk(mesh.size(dim_i), dim=placement.dim)[mesh.get_local_rank(dim_i)]
            param.to_local().copy_(local)
        else:
            param.copy_(full)
