"""FSDP2 trainer on a subgroup (ranks 1, 2 of a 3-rank gloo world) against a 1-process reference.

Rank 0 is not a trainer: it runs the same steps on a plain `Trainer(group=None)`, which proves
that the sharded trainer's loss and updated weights are those of one process (within 1e-5), on
a group that does not contain global rank 0. The second step has uneven shares (one rank runs
a padding micro-batch), stale tokens (decoupled objective: behaviour weights) and a KL reference
that is sharded too. A NaN in one micro-batch of one trainer rank skips the step on both ranks:
every rank's weights stay as they were, and the next finite step matches the reference.
"""

import numpy as np
import pytest
import torch
import torch.distributed as dist

from engine.devices import DeviceInfo
from engine.runtime.launch import PRELOAD, spawn
from engine.trainer.trainer import Trainer, TrainerConfig, plan_micro_batches
from trainer_helpers import make_trajs

CPU = DeviceInfo("cpu", 2)
# adam_eps=1 keeps the first updates linear in the gradient (see test_micro_batching_...).
CFG = dict(lr=1e-2, adam_eps=1.0, micro_batch_tokens=16, kl_coef=0.1)


def batches():
    return [make_trajs(seed=0, version=0), make_trajs(num_groups=1, n=3, seed=1, version=0)]


def _train(ctx, extra: dict):
    from engine.models import build_tiny

    sub = dist.new_group([1, 2])  # every rank calls new_group, in the same order
    model, _ = build_tiny(0)
    trainer = Trainer(model, TrainerConfig(**CFG, **extra), group=sub if ctx.rank else None)
    metrics = [trainer.train_step(trajs, version) for version, trajs in enumerate(batches())]
    full = trainer.full_state_dict()
    state = trainer.state_dict()
    trainer.load_state_dict(state)  # the DCP helpers must also load on a subgroup
    reloaded = trainer.full_state_dict()
    same = all(torch.equal(full[k], reloaded[k]) for k in full)
    # numpy, not tensors: torch's queue pickling shares memory by fd, gone once the rank exits
    as_np = lambda sd: {k: v.detach().numpy().copy() for k, v in sd.items()}  # noqa: E731
    return {"metrics": metrics, "params": as_np(full), "state_model": as_np(state["model"]), "reload_same": same,
            "num_optim_states": len(state["optimizer"]["state"])}


@pytest.mark.parametrize("extra", [{}, {"activation_checkpointing": "on", "pack_sequences": False, "logprob_chunk_tokens": 0}],
                         ids=["packed-chunked", "padded-whole-logits-checkpointed"])
def test_fsdp2_subgroup_matches_single_process(extra):
    lengths = [t.num_tokens for t in batches()[1]]
    plan = plan_micro_batches(lengths, 2, CFG["micro_batch_tokens"], packed=extra.get("pack_sequences", True))
    assert len(plan[0]) != len(plan[1]), "step 2 must exercise the padding micro-batch"

    ref, r1, r2 = spawn(_train, 3, (extra,), device_info=CPU, timeout_s=90,
                        preload=PRELOAD + ["engine.trainer.trainer", "engine.models", "transformers.models.qwen2.modeling_qwen2"])
    for rank in (r1, r2):
        for m_ref, m in zip(ref["metrics"], rank["metrics"]):
            for key in ("train/loss", "train/pg_loss", "train/kl", "train/clip_frac", "train/stale_tokens",
                        "train/behaviour_weight_mean", "train/behaviour_weight_max"):
                assert m.get(key, 0.0) == pytest.approx(m_ref.get(key, 0.0), abs=1e-5), key
            assert m["train/grad_norm"] == pytest.approx(m_ref["train/grad_norm"], rel=1e-5)
        assert list(rank["params"]) == list(ref["params"])
        for k, v in ref["params"].items():
            assert np.allclose(rank["params"][k], v, atol=1e-5, rtol=0), k
            assert np.array_equal(rank["state_model"][k], rank["params"][k]), k
        assert rank["reload_same"] and rank["num_optim_states"] == ref["num_optim_states"]
    assert ref["metrics"][1]["train/stale_tokens"] > 0 and ref["metrics"][1]["train/kl"] > 0
    assert np.array_equal(r1["params"]["model.norm.weight"], r2["params"]["model.norm.weight"])


def _poisoned_batches():
    """A NaN recorded log-prob in a trajectory that the plan gives the second trainer rank only, then a clean step."""
    first = make_trajs(seed=0, version=0)
    plan = plan_micro_batches([t.num_tokens for t in first], 2, CFG["micro_batch_tokens"], packed=True)
    first[plan[1][0][0]].logprobs[-1] = float("nan")
    return [first, make_trajs(num_groups=1, n=3, seed=1, version=1)]


def _train_through_a_nan(ctx):
    from engine.models import build_tiny

    sub = dist.new_group([1, 2])
    model, _ = build_tiny(0)
    trainer = Trainer(model, TrainerConfig(**CFG), group=sub if ctx.rank else None)
    initial = {k: v.detach().numpy().copy() for k, v in trainer.full_state_dict().items()}
    out = {"metrics": [], "params": []}
    for version, trajs in enumerate(_poisoned_batches()):
        out["metrics"].append(trainer.train_step(trajs, version))
        out["params"].append({k: v.detach().numpy().copy() for k, v in trainer.full_state_dict().items()})
    out["initial"] = initial
    return out


def test_a_nan_on_one_rank_skips_the_step_on_every_rank():
    ref, r1, r2 = spawn(_train_through_a_nan, 3, device_info=CPU, timeout_s=90,
                        preload=PRELOAD + ["engine.trainer.trainer", "engine.models", "transformers.models.qwen2.modeling_qwen2"])
    for out in (ref, r1, r2):
        nan_step, clean = out["metrics"]
        assert nan_step["train/nonfinite_skipped"] == 1.0 and nan_step["train/stepped"] == 0.0
        assert clean["train/nonfinite_skipped"] == 0.0 and clean["train/stepped"] == 1.0
        for k, v in out["initial"].items():
            assert np.array_equal(out["params"][0][k], v), k  # the NaN step changed nothing
        for k, v in ref["params"][1].items():
            assert np.allclose(out["params"][1][k], v, atol=1e-5, rtol=0), k  # nor the optimizer state
