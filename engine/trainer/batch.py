"""How the trainer lays out a step's trajectories and gets their token log-probs from the policy.

Three things decide the trainer's memory at long context, and each is a config switch
(`TrainerConfig`) measured by `python -m bench.trainer_memory`:

  1. Micro-batches (`plan_micro_batches`): trajectories sorted longest first go to the trainer
     rank with the fewest tokens so far; each rank fills micro-batches up to `micro_batch_tokens`.
     Padded (`pack_sequences=False`), a micro-batch costs sequences x longest; packed, the sum of
     the lengths, because the sequences lie end to end in one row.
  2. The row layout (`collate`): padded rows [B, L-1] with an attention mask, or one packed row
     [1, N] whose position ids restart at 0 for each sequence; transformers turns restarting
     position ids (and no attention mask) into a block-diagonal causal mask, or variable-length
     flash attention, so no token attends across sequences. Either way the loss math downstream
     sees the same padded [B, L-1] tensors: packed log-probs are gathered back into them.
  3. The output layer (`policy_logprobs`): with `logprob_chunk_tokens` > 0, the model's output
     layer returns the targets' log-probs computed a chunk of tokens at a time
     (`engine.trainer.algos.chunked_token_logprobs`) instead of [tokens, vocab] logits. It is swapped in
     for one forward *inside* the model's own forward, because FSDP2 gathers the output layer's
     weight in the root module's forward hooks: calling the backbone and the head separately
     would bypass them.

Invariants (tests/engine/trainer/test_trainer.py, tests/engine/trainer/test_trainer_fsdp.py): the plan covers every trajectory
exactly once and respects the budget unless one sequence alone exceeds it; packed and padded
layouts, chunked and whole logits, with and without activation checkpointing, give the same
log-probs, loss and update (to float32 rounding), on one rank and on an FSDP2 group.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from engine.trainer.algos import chunked_token_logprobs, token_logprobs
from engine.trajectory import Trajectory


def plan_micro_batches(lengths: list[int], num_ranks: int, micro_batch_tokens: int, *, packed: bool = False) -> list[list[list[int]]]:
    """Deterministic plan: plan[rank][micro] = indices into `lengths`, each index exactly once."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    load = [0] * num_ranks
    shares: list[list[int]] = [[] for _ in range(num_ranks)]
    for i in order:
        rank = min(range(num_ranks), key=lambda r: (load[r], r))
        shares[rank].append(i)
        load[rank] += lengths[i]
    plan = []
    for share in shares:
        micros: list[list[int]] = []
        for i in share:  # longest first, so a padded micro-batch's first member sets its width
            last = micros[-1] if micros else None
            if last is not None:
                grown = sum(lengths[j] for j in last) + lengths[i] if packed else (len(last) + 1) * lengths[last[0]]
                if grown <= micro_batch_tokens:
                    last.append(i)
                    continue
            micros.append([i])
        plan.append(micros)
    return plan


def padding_trajectory() -> Trajectory:
    """A micro-batch with nothing to learn, for a rank with fewer micro-batches than its FSDP2 peers."""
    return Trajectory(request_id="<pad>", task_id="", group_id="<pad>", prompt_len=2, token_ids=[0, 0],
                      loss_mask=[0, 0], logprobs=[0.0, 0.0], versions=[-1, -1], reward=0.0)


def collate(trajectories: list[Trajectory], advantages: list[float], device, *, packed: bool = False) -> dict[str, torch.Tensor]:
    """Right-padded next-token tensors [B, L-1]: inputs, targets, mask, old log-probs, versions;
    packed, also the one-row layout [1, N] and where each of its tokens goes in the padded one."""
    width = max(t.num_tokens for t in trajectories)
    num = len(trajectories)
    ids = torch.zeros(num, width, dtype=torch.long)
    attn = torch.zeros(num, width, dtype=torch.long)
    mask = torch.zeros(num, width)
    old = torch.zeros(num, width)
    versions = torch.full((num, width), -1, dtype=torch.long)
    for row, t in enumerate(trajectories):
        n = t.num_tokens
        ids[row, :n] = torch.tensor(t.token_ids)
        attn[row, :n] = 1
        mask[row, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        old[row, :n] = torch.tensor(t.logprobs, dtype=torch.float32)
        versions[row, :n] = torch.tensor(t.versions)
    # Position 0 is never predicted; it is prompt by contract (loss mask 0).
    batch = {
        "input_ids": ids[:, :-1], "attention_mask": attn[:, :-1], "targets": ids[:, 1:], "mask": mask[:, 1:],
        "old_logprobs": old[:, 1:], "versions": versions[:, 1:], "advantages": torch.tensor(advantages, dtype=torch.float32),
    }
    if packed:
        lengths = [t.num_tokens - 1 for t in trajectories]
        batch["packed_ids"] = torch.cat([ids[row, :n] for row, n in enumerate(lengths)]).unsqueeze(0)
        batch["packed_targets"] = torch.cat([ids[row, 1:n + 1] for row, n in enumerate(lengths)]).unsqueeze(0)
        batch["packed_positions"] = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
        starts = torch.tensor([0] + lengths[:-1]).cumsum(0)
        batch["unpack_index"] = (starts.unsqueeze(1) + torch.arange(width - 1)).clamp(max=sum(lengths) - 1)
        batch["target_valid"] = attn[:, 1:]
    return {k: v.to(device) for k, v in batch.items()}


@contextlib.contextmanager
def _logprob_head(model: nn.Module, targets: torch.Tensor, temperature: float, chunk_tokens: int):
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, nn.Linear):
        raise ValueError(f"{type(model).__name__} has no linear output layer (get_output_embeddings() -> {type(head).__name__}) "
                         "to compute log-probs in chunks; set --trainer.logprob-chunk-tokens 0")

    def forward(hidden: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> the targets' log-probs [B, T]
        return chunked_token_logprobs(hidden, head.weight, targets, temperature=temperature,
                                      chunk_tokens=chunk_tokens, bias=head.bias)

    head.forward = forward
    try:
        yield
    finally:
        del head.forward


def policy_logprobs(model: nn.Module, batch: dict[str, torch.Tensor], *, temperature: float, chunk_tokens: int) -> torch.Tensor:
    """float32 log-probs of `batch`'s targets under `model`, laid out like batch["targets"] [B, L-1]."""
    packed = "packed_ids" in batch
    if packed:
        inputs = {"input_ids": batch["packed_ids"], "position_ids": batch["packed_positions"]}
        targets = batch["packed_targets"]
    else:
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        targets = batch["targets"]
    if chunk_tokens:
        with _logprob_head(model, targets, temperature, chunk_tokens):
            logprobs = model(**inputs, use_cache=False).logits
    else:
        logprobs = token_logprobs(model(**inputs, use_cache=False).logits, targets, temperature)
    if not packed:
        return logprobs
    valid = batch["target_valid"] > 0
    return torch.where(valid, logprobs[0][batch["unpack_index"]], torch.zeros((), dtype=logprobs.dtype, device=logprobs.device))


def enable_activation_checkpointing(model: nn.Module) -> None:
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.24
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ValueError(f"{type(model).__name__} has no activation checkpointing (not a transformers model); "
                         "set --trainer.activation-checkpointing off")
