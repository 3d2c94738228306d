"""GRPO trainer over a trainer process group (FSDP2 when the group has more than one rank).

Every trainer rank calls `train_step` with the SAME full list of trajectories; the trainer
shards the batch itself, so no rank needs to be told its part.

Algorithm of one `train_step(trajectories, policy_version)`:
  1. Advantages per `group_id` from `reward` (`engine.algos.group_advantages`).
  2. Plan (identical on every rank, no communication): trajectories sorted longest first go to
     the rank with the fewest tokens so far (ties: lowest rank); each rank fills micro-batches of
     at most `micro_batch_tokens` tokens, packed end to end or padded (engine/trainer_batch.py).
     Ranks with fewer micro-batches run padding micro-batches (mask all 0) because every FSDP2
     forward is a collective all-gather.
  3. Per micro-batch: forward, float32 token log-probs (a chunk of tokens at a time through the
     output layer, never full-vocabulary logits), PPO-clip loss with the global
     denominators of the whole step (so micro-batches and ranks sum to the full-batch loss),
     plus `kl_coef` * KL to a frozen copy of the initial policy, backward.
  4. Behaviour log-probs: the rollout's `logprobs`, or (`recompute_logprobs`) the current
     policy's own. With one optimizer step per train_step the current policy before the step is
     exactly what the training forward evaluates, so recomputing costs no extra forward: the
     detached log-probs of that same forward are used (ratio 1 on those tokens).
  5. Clip the gradient norm, AdamW step, `policy_version += 1`. A batch whose advantages are
     all zero (and no KL) carries no signal: its gradient is exactly zero, so the step runs no
     forward or backward at all (every rank decides alike from the same list) and the optimizer
     does not step, so weight decay and Adam's step count leave the weights exactly as they were.
Precision (engine/precision.py): float32 everywhere on CPU; on CUDA/NPU float32 master weights
and optimizer state with bf16 compute (FSDP2 mixed precision when sharded, autocast on one rank).
Memory: `activation_checkpointing` (on by default on accelerators) keeps each decoder layer's
input only and recomputes the layer in backward.

Invariants (tests/test_trainer*.py): a zero-advantage step changes no parameter; parameters
change otherwise; loss and updated weights of a 2-rank FSDP2 subgroup match a single-process
reference; the plan covers every trajectory exactly once; staleness beyond `max_staleness`
(unless None: finish-order systems bound it at admission) or a policy_version mismatch is refused.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from engine.algos import group_advantages, kl_penalty, ppo_clip_loss
from engine.devices import trim_host_heap
from engine.precision import Precision, autocast, fsdp_mp_policy, precision_for
from engine.trainer_config import TrainerConfig
from engine.trainer_batch import collate, padding_trajectory, plan_micro_batches, policy_logprobs
from engine.trajectory import Trajectory

log = logging.getLogger(__name__)

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


def enable_activation_checkpointing(model: nn.Module) -> None:
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.24
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ValueError(f"{type(model).__name__} has no activation checkpointing (not a transformers model); "
                         "set --trainer.activation-checkpointing off")


class Trainer:
    """GRPO on `model`, sharded with FSDP2 over `group` when it has more than one rank."""

    def __init__(self, model: nn.Module, cfg: TrainerConfig, *, group: dist.ProcessGroup | None = None,
                 device: torch.device | str = "cpu", policy_version: int = 0, precision: Precision | None = None):
        self.cfg = cfg
        self.device = torch.device(device)
        self.precision = precision or precision_for(self.device.type)  # bf16 compute, fp32 master on accelerators
        self.group = group
        self.num_ranks = dist.get_world_size(group) if group is not None else 1
        self.rank = dist.get_rank(group) if group is not None else 0
        self.policy_version = policy_version
        model = model.to(self.device, dtype=self.precision.master_dtype)
        ref = copy.deepcopy(model) if cfg.kl_coef > 0 else None
        self.activation_checkpointing = cfg.activation_checkpointing == "on" or (
            cfg.activation_checkpointing == "auto" and self.device.type != "cpu")
        if self.activation_checkpointing:
            # each decoder layer keeps only its input and recomputes the rest in backward; set before
            # sharding so FSDP2 wraps the checkpointed layers (non-reentrant: it composes with FSDP2)
            enable_activation_checkpointing(model)
        self.model = self._shard(model)
        self.model.train()
        self.ref_model = None
        if ref is not None:
            ref.requires_grad_(False)
            self.ref_model = self._shard(ref).eval()
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=cfg.lr, betas=cfg.betas,
            eps=cfg.adam_eps, weight_decay=cfg.weight_decay,
        )

    @property
    def sharded(self) -> bool:
        return self.num_ranks > 1

    def _shard(self, model: nn.Module) -> nn.Module:
        if not self.sharded:
            return model
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(self.group, device_type=self.device.type)
        policy = fsdp_mp_policy(self.precision)
        kw = {"mesh": mesh, **({"mp_policy": policy} if policy is not None else {})}
        for layer in getattr(getattr(model, "model", None), "layers", []):
            fully_shard(layer, **kw)
        return fully_shard(model, **kw)

    def _logprobs(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        # sharded: FSDP2's policy casts; one rank: autocast (a no-op context on CPU)
        with contextlib.nullcontext() if self.sharded else autocast(self.precision, self.device.type):
            return policy_logprobs(model, batch, temperature=self.cfg.temperature, chunk_tokens=self.cfg.logprob_chunk_tokens)

    # ---- the step ----------------------------------------------------------------------------

    def _check_batch(self, trajectories: list[Trajectory], policy_version: int) -> None:
        if policy_version != self.policy_version:
            raise ValueError(f"train_step(policy_version={policy_version}) but the trainer holds version {self.policy_version}; pass trainer.policy_version")
        if not trajectories:
            raise ValueError("train_step got no trajectories; skip the step when the batch is empty")
        for t in trajectories:
            t.check()
            used = t.policy_versions
            if used and used[-1] > policy_version:
                raise ValueError(f"trajectory {t.request_id} has tokens of version {used[-1]} > trainer version {policy_version}; versions come from the trainer")
            if used and self.cfg.max_staleness is not None and policy_version - used[0] > self.cfg.max_staleness:
                raise ValueError(f"trajectory {t.request_id} has staleness {policy_version - used[0]} > max_staleness={self.cfg.max_staleness}; drop it as stale before training")

    def train_step(self, trajectories: list[Trajectory], policy_version: int) -> dict[str, float]:
        """One GRPO update on the full batch (same list on every rank); returns summed metrics."""
        start_s = time.perf_counter()
        self._check_batch(trajectories, policy_version)
        advantages = trajectory_advantages(trajectories, normalize_std=self.cfg.normalize_std, eps=self.cfg.adv_eps)
        # Position 0 is never a target, so count model tokens from position 1 on.
        seq_tokens = [sum(t.loss_mask[1:]) for t in trajectories]
        if self.cfg.kl_coef == 0 and not any(a != 0.0 and n > 0 for a, n in zip(advantages, seq_tokens)):
            # An early-run policy often earns the same reward on every sample (SmolLM2 on swe: all 0);
            # skipping its forward/backward saves a whole step of trainer time and changes no result.
            self.policy_version += 1
            return self._metrics({"loss": 0.0, "pg_loss": 0.0, "kl": 0.0}, trajectories, advantages, 0.0, False, 0, start_s)
        packed = self.cfg.pack_sequences
        plan = plan_micro_batches([t.num_tokens for t in trajectories], self.num_ranks, self.cfg.micro_batch_tokens, packed=packed)
        num_micro = max(len(micros) for micros in plan)
        denoms = {"num_tokens": max(sum(seq_tokens), 1), "num_seqs": max(sum(1 for n in seq_tokens if n), 1)}
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = defaultdict(float)
        mine = plan[self.rank]
        for m in range(num_micro):
            if m < len(mine):
                batch = [trajectories[i] for i in mine[m]]
                batch_adv = [advantages[i] for i in mine[m]]
            else:
                batch, batch_adv = [padding_trajectory()], [0.0]
            for key, value in self._micro_step(collate(batch, batch_adv, self.device, packed=packed), policy_version, denoms).items():
                sums[key] += value
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.policy_version += 1
        return self._metrics(sums, trajectories, advantages, float(grad_norm), True, num_micro, start_s)

    def _micro_step(self, batch: dict[str, torch.Tensor], policy_version: int, denoms: dict) -> dict[str, float]:
        cfg = self.cfg
        logprobs = self._logprobs(self.model, batch)
        mask = batch["mask"]
        old = batch["old_logprobs"]
        recompute = self._recompute_mask(batch["versions"], policy_version)
        if recompute is not None:
            old = torch.where(recompute, logprobs.detach(), old)
        agg = dict(aggregation=cfg.aggregation, **denoms)
        pg_loss, pg_metrics = ppo_clip_loss(logprobs, old, batch["advantages"], mask, cfg.clip_low, cfg.clip_high, **agg)
        loss = pg_loss
        kl = torch.zeros(())
        if self.ref_model is not None:
            with torch.no_grad():
                ref_logprobs = self._logprobs(self.ref_model, batch)
            kl = kl_penalty(logprobs, ref_logprobs, mask, cfg.kl_kind, **agg)
            loss = loss + cfg.kl_coef * kl
        # FSDP2 averages gradients over the group; the loss is already a global sum, so undo it.
        self._trim_host_heap()  # the forward's freed pages, before the backward allocates its own
        (loss * self.num_ranks).backward()
        self._trim_host_heap()  # and the backward's, before the next micro-batch or the optimizer's state
        out = {"loss": loss.item(), "pg_loss": pg_loss.item(), "kl": kl.item()}
        out.update({k: v.item() for k, v in pg_metrics.items()})
        if recompute is not None:
            out["recomputed_tokens"] = float((recompute & (mask > 0)).sum())
        return out

    def _trim_host_heap(self) -> None:
        if self.device.type == "cpu":  # on a GPU the caching allocator keeps blocks on purpose
            trim_host_heap()

    def _recompute_mask(self, versions: torch.Tensor, policy_version: int) -> torch.Tensor | None:
        mode = self.cfg.recompute_logprobs
        if mode == "never":
            return None
        if mode == "always":
            return torch.ones_like(versions, dtype=torch.bool)
        return versions < policy_version

    def _metrics(self, sums, trajectories, advantages, grad_norm, stepped, num_micro, start_s) -> dict[str, float]:
        keys = sorted(sums)
        if self.sharded:
            packed = torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=self.device)
            dist.all_reduce(packed, group=self.group)
            sums = dict(zip(keys, packed.tolist()))
        rewards = [float(t.reward) for t in trajectories]
        ages = [self.policy_version - 1 - v for t in trajectories for v in t.policy_versions[:1]]
        metrics = {f"train/{k}": float(sums[k]) for k in keys}
        metrics.update({
            "train/grad_norm": grad_norm,
            "train/stepped": float(stepped),
            "train/tokens": float(sum(t.num_tokens for t in trajectories)),
            "train/model_tokens": float(sum(t.loss_mask[1:].count(1) for t in trajectories)),
            "train/trajectories": float(len(trajectories)),
            "train/micro_batches": float(num_micro),
            "train/reward_mean": sum(rewards) / len(rewards),
            "train/adv_abs_mean": sum(abs(a) for a in advantages) / len(advantages),
            "train/staleness_max": float(max(ages, default=0)),
            "train/lr": self.cfg.lr,
            "train/step_s": time.perf_counter() - start_s,
        })
        if not math.isfinite(grad_norm):
            log.warning("[libra trainer:%d] non-finite grad norm %s at policy_version %d", self.rank, grad_norm, self.policy_version - 1)
        return metrics

    # ---- weights and checkpoints -------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full unsharded weights on every trainer rank, same names as `model.state_dict()`.

        Unsharded (one rank) these are the live tensors, detached: copy them before the next
        `train_step` if they must stay as they are now.
        """
        if not self.sharded:
            return {k: v.detach() for k, v in self.model.state_dict().items()}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # cpu_offload=True returns {} when global rank 0 is not a trainer (PLATFORM.md).
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=False))

    def state_dict(self) -> dict:
        """Model + optimizer, full (unsharded) copies, so a group of another size can load it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
        from torch.utils._pytree import tree_map

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
        # Copies: the live optimizer updates its moments in place, and a trainer loading this
        # dict in the same process would otherwise share (and double-step) them.
        state = {"model": model_sd, "optimizer": optim_sd}
        state = tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, state)
        return {**state, "policy_version": self.policy_version}

    def load_state_dict(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
        from torch.utils._pytree import tree_map

        # set_state_dict replaces the values of the dicts it is given with sharded tensors:
        # hand it fresh containers so the caller's state stays a full state.
        state = tree_map(lambda x: x, {"model": state["model"], "optimizer": state["optimizer"], "policy_version": state["policy_version"]})
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=StateDictOptions(full_state_dict=True))
        self.policy_version = int(state["policy_version"])


HANDOFF_FILE = "trainer.pt"


def save_handoff(trainer: Trainer, path: str | Path, *, write: bool) -> None:
    """The trainer's full state where a trainer group of any size can load it (`load_handoff`):
    a role switch's hand-off and a checkpoint. A collective over the trainer group; the rank
    with `write` writes it, atomically."""
    state = trainer.state_dict()
    if write:
        target = Path(path)
        target.mkdir(parents=True, exist_ok=True)
        tmp = target / f"{HANDOFF_FILE}.tmp{os.getpid()}"
        torch.save(state, tmp)
        tmp.replace(target / HANDOFF_FILE)


def load_handoff(trainer: Trainer, path: str | Path, device) -> None:
    """Load what `save_handoff` wrote into a freshly built trainer (a collective over its group)."""
    trainer.load_state_dict(torch.load(Path(path) / HANDOFF_FILE, map_location=device, weights_only=False))
