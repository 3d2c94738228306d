"""Elastic joins (engine/trainer/elastic.py): a helper's gradient summed into the trainer's step equals the
trainer's own step on the whole batch.

Rank 0 trains a plain one-process `Trainer` on each batch alone: the reference. The others build the layout
under test from the same initial weights: one trainer rank and one helper, or an FSDP2 group of two trainer
ranks and one helper (a group that does not contain rank 0, and is built once and never rebuilt for the
helper). The helper holds a copy of the policy at the trainer's pre-step weights, as an idle rollout
instance does under one step of lookahead, and is given the updated weights after each step.
"""

import numpy as np
import pytest
import torch
import torch.distributed as dist

from engine.devices import DeviceInfo
from engine.runtime.launch import PRELOAD, spawn
from engine.trainer.elastic import buckets
from engine.trainer.trainer import Trainer, TrainerConfig, plan_step
from trainer_helpers import make_trajs

CPU = DeviceInfo("cpu", 2)
CFG = dict(lr=1e-2, adam_eps=1.0, micro_batch_tokens=16)


def batches():
    # the second batch has stale tokens (decoupled objective: behaviour weights) and no signal in one group
    return [make_trajs(num_groups=3, n=4, seed=0, version=0),
            make_trajs(num_groups=2, n=3, seed=1, version=0, rewards=[1.0, 0.0, 0.5, 1.0, 1.0, 1.0])]


def _run(ctx, num_trainers: int):
    from engine.models import build_tiny
    from engine.trainer import elastic
    from engine.trainer.elastic import help_step

    elastic.BUCKET_VALUES = 50_000  # several messages per hand-off, as a real model's takes

    trainer_ranks = tuple(range(1, 1 + num_trainers))
    helper = 1 + num_trainers
    sub = dist.new_group(list(trainer_ranks))  # every rank calls new_group, in the same order
    model, _ = build_tiny(0)
    cfg = TrainerConfig(**CFG)
    out = {"metrics": [], "params": None}
    if ctx.rank == 0:
        trainer = Trainer(model, cfg)
        out["metrics"] = [trainer.train_step(trajs, version) for version, trajs in enumerate(batches())]
        out["params"] = {k: v.numpy().copy() for k, v in trainer.full_state_dict().items()}
    elif ctx.rank in trainer_ranks:
        trainer = Trainer(model, cfg, group=sub if num_trainers > 1 else None)
        for version, trajs in enumerate(batches()):
            out["metrics"].append(trainer.train_step(trajs, version, helpers=(helper,)))
            full = trainer.full_state_dict()
            if ctx.rank == trainer_ranks[0]:  # the next step's weights to the helper, as a weight sync would
                for v in full.values():
                    dist.send(v.contiguous(), dst=helper)
        out["params"] = {k: v.numpy().copy() for k, v in trainer.full_state_dict().items()}
    else:
        before = None
        for version, trajs in enumerate(batches()):
            before = {k: v.clone() for k, v in model.state_dict().items()}
            help_step(model, version, trajs, version, cfg, slot=num_trainers, num_slots=num_trainers + 1,
                      trainer_ranks=trainer_ranks, device=torch.device("cpu"))
            out["unchanged"] = all(torch.equal(before[k], v) for k, v in model.state_dict().items())
            out["no_grads"] = all(p.grad is None for p in model.parameters())
            with torch.no_grad():
                for v in model.state_dict().values():
                    dist.recv(v, src=trainer_ranks[0])
    return out


@pytest.mark.parametrize("num_trainers", [1, 2], ids=["one-trainer", "fsdp2-pair"])
def test_a_helpers_gradient_summed_in_equals_the_trainers_own_step(num_trainers):
    results = spawn(_run, num_trainers + 2, (num_trainers,), device_info=CPU, timeout_s=90,
                    preload=PRELOAD + ["engine.trainer.trainer", "engine.models", "transformers.models.qwen2.modeling_qwen2"])
    ref, trainers, helper = results[0], results[1:-1], results[-1]
    assert helper["unchanged"] and helper["no_grads"]
    for rank in trainers:
        for m_ref, m in zip(ref["metrics"], rank["metrics"], strict=True):
            for key in ("train/loss", "train/pg_loss", "train/stale_tokens", "train/behaviour_weight_mean"):
                assert m.get(key, 0.0) == pytest.approx(m_ref.get(key, 0.0), abs=1e-5), key
            assert m["train/grad_norm"] == pytest.approx(m_ref["train/grad_norm"], rel=1e-5)
            assert m["train/elastic_helpers"] == 1.0
        for k, v in ref["params"].items():
            assert np.allclose(rank["params"][k], v, atol=1e-5, rtol=0), k
    assert ref["metrics"][1]["train/stale_tokens"] > 0
    # the helper had a real share of each step, not an empty slot
    for trajs in batches():
        assert plan_step(trajs, TrainerConfig(**CFG), num_trainers + 1).plan[num_trainers]


def test_hand_off_buckets_keep_order_and_bound_each_message():
    assert buckets([3, 4, 2, 10, 1], max_values=7) == [[0, 1], [2], [3], [4]]
    assert buckets([], max_values=7) == []
    assert [i for b in buckets([5] * 11, max_values=12) for i in b] == list(range(11))
