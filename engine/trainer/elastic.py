"""Idle rollout instances join a training step (the paper's elastic hybrid pool): the gradient half.

A helper is a rollout rank whose instance has nothing to run while the trainer trains batch n. It holds
the policy the batch is trained from (under one-step lookahead the rollout decodes with the trainer's
pre-step weights), so the gradient of any share of the batch computed on it is the trainer's own.

Algorithm of one step with helpers h_1..h_m (global ranks) beside k trainer ranks:
  1. Every rank derives the same `StepPlan` from the same list over k + m slots
     (engine/trainer/step.py `plan_step`): trainer rank r takes slot r, helper j slot k + j.
  2. A helper runs its slot's micro-batches through the same loss (`micro_batch_loss`, the step's
     global denominators) and backward, on its own unsharded model; it adds nothing to its weights.
  3. It sends each trainer rank that rank's FSDP2 shard of every parameter's gradient (dim-0 chunks,
     as `fully_shard` cuts them; the whole gradient to an unsharded trainer), flattened into float32
     messages of at most `BUCKET_VALUES` values, point to point over the default group: no process group is built for it, so the
     trainer's FSDP group is never rebuilt. Its metric sums go to the first trainer rank.
  4. Each trainer rank adds the helpers' shards, in helper order, to its own gradient shards after its
     backward (FSDP2 has reduce-scattered them), then clips and steps as usual.
The trainer's FSDP2 loss is scaled by k to undo FSDP's averaging; a helper's gradient is not averaged, so
its loss is not scaled. A helper must hold exactly the weights the batch is trained from: `help_step`
refuses a model of another policy version.

Invariants (tests/engine/trainer/test_elastic.py, gloo processes): one trainer rank, or two FSDP2 ranks,
with a helper compute the same loss, gradient norm and updated weights as one trainer on the whole batch
(to float32 rounding); a helper's model is left unchanged, with no gradient kept.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from engine.trainer.batch import collate, enable_activation_checkpointing, policy_logprobs
from engine.trainer.config import TrainerConfig
from engine.trainer.step import add_metrics, micro_batch_loss, plan_step
from engine.trajectory import Trajectory

_GRAD_DTYPE = torch.float32
BUCKET_VALUES = 16 * 2**20  # float32 values per message (64 MiB): the hand-off never holds a whole float32 gradient


def help_step(model: nn.Module, model_version: int, trajectories: list[Trajectory], policy_version: int,
              cfg: TrainerConfig, *, slot: int, num_slots: int, trainer_ranks: tuple[int, ...],
              device: torch.device) -> dict[str, float]:
    """On a helper holding `model` at `model_version`: the gradient of `slot`'s share of the step trained
    from `policy_version`, sent to the trainer ranks (global ranks); returns the share's metric sums (also
    sent to the first trainer rank)."""
    if model_version != policy_version:
        raise RuntimeError(f"an elastic helper holds policy version {model_version}, the step trains from "
                           f"{policy_version}: its gradient would not be the trainer's")
    if cfg.kl_coef != 0:
        raise ValueError(f"an elastic helper has no KL reference model (kl_coef={cfg.kl_coef}); "
                         "the coordinator must not choose helpers when --trainer.kl-coef is set")
    step = plan_step(trajectories, cfg, num_slots)
    if not step.signal:
        return {}  # the trainer skips the step alike and waits for no gradient
    params = list(model.parameters())
    was = [p.requires_grad for p in params]
    sums: dict[str, float] = {}
    if cfg.activation_checkpointing == "on" or (cfg.activation_checkpointing == "auto" and device.type != "cpu"):
        enable_activation_checkpointing(model)  # as the trainer's ranks do: an idle instance still holds its KV memory
        model.train()  # transformers checkpoints layers only in training mode (these policies have no dropout)
    try:
        for p in params:
            p.requires_grad_(True)
            p.grad = None
        with torch.enable_grad():
            for micro in step.plan[slot]:
                batch = collate([step.trajectories[i] for i in micro], [step.advantages[i] for i in micro], device,
                                packed=cfg.pack_sequences)
                logprobs = policy_logprobs(model, batch, temperature=cfg.temperature, chunk_tokens=cfg.logprob_chunk_tokens)
                loss, out = micro_batch_loss(logprobs, batch, cfg, policy_version, step.denoms)
                loss.backward()
                add_metrics(sums, out)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        _send_shards(grads, trainer_ranks, sums)
    finally:
        for p, req in zip(params, was):
            p.grad = None
            p.requires_grad_(req)
        model.eval()
    return sums


def _send_shards(grads: list[torch.Tensor], trainer_ranks: tuple[int, ...], sums: dict[str, float]) -> None:
    k = len(trainer_ranks)
    for r, dst in enumerate(trainer_ranks):
        shards = [shard_of(g, r, k).reshape(-1) for g in grads]
        device = grads[0].device
        dist.send(torch.tensor([sum(x.numel() for x in shards)], dtype=torch.int64, device=device), dst=dst)
        for bucket in buckets([x.numel() for x in shards]):
            dist.send(torch.cat([shards[i].to(_GRAD_DTYPE) for i in bucket]), dst=dst)
        if r == 0:
            dist.send_object_list([sums], dst=dst, device=device)


def buckets(sizes: list[int], max_values: int | None = None) -> list[list[int]]:
    """Consecutive indices grouped into messages of at most `max_values` (default `BUCKET_VALUES`) values; a
    larger tensor alone in one."""
    max_values = max_values or BUCKET_VALUES
    out: list[list[int]] = []
    total = 0
    for i, n in enumerate(sizes):
        if not out or total + n > max_values:
            out.append([])
            total = 0
        out[-1].append(i)
        total += n
    return out


def shard_of(tensor: torch.Tensor, rank: int, num_ranks: int) -> torch.Tensor:
    """FSDP2's shard of `tensor` on `rank` of `num_ranks` (dim-0 chunks; ranks past the last chunk: empty)."""
    chunks = torch.chunk(tensor, num_ranks, dim=0)
    return chunks[rank] if rank < len(chunks) else tensor.new_empty((0, *tensor.shape[1:]))


def add_helper_gradients(model: nn.Module, helpers: tuple[int, ...], rank: int, num_ranks: int,
                         device: torch.device) -> list[dict[str, float]]:
    """On trainer rank `rank` (of `num_ranks`), after its backward: add each helper's gradient shard to its own.
    Returns the helpers' metric sums (on the first trainer rank; [] elsewhere)."""
    params = list(model.parameters())
    local = []
    for p in params:
        if p.grad is None:  # a parameter this rank's micro-batches did not reach
            p.grad = torch.zeros_like(p)
        local.append(p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad)
    numel = sum(g.numel() for g in local)
    parts = []
    for src in helpers:
        size = torch.zeros(1, dtype=torch.int64, device=device)
        dist.recv(size, src=src)
        if int(size) != numel:
            raise RuntimeError(f"trainer rank {rank}: helper rank {src} sent a gradient shard of {int(size)} values, "
                               f"this rank's is {numel}: the helper's model is not the trainer's")
        for bucket in buckets([g.numel() for g in local]):
            flat = torch.empty(sum(local[i].numel() for i in bucket), dtype=_GRAD_DTYPE, device=device)
            dist.recv(flat, src=src)
            offset = 0
            for i in bucket:
                g = local[i]
                g.add_(flat[offset: offset + g.numel()].view_as(g).to(g.dtype))
                offset += g.numel()
        if rank == 0:
            box = [None]
            dist.recv_object_list(box, src=src, device=device)
            parts.append(box[0])
    return parts
