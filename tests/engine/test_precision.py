"""Precision and colocated memory: the decisions per device on CPU, the mechanics where they run here, GPU opt-in."""

import time

import pytest
import torch
import torch.distributed as dist

from engine.devices import DeviceInfo
from engine.runtime.launch import spawn
from engine.models import build_tiny, render_prompt
from engine.precision import autocast, fsdp_mp_policy, precision_for
from engine.rollout.engine import Finished, RolloutConfig, RolloutEngine, RolloutRequest
from engine.trainer.trainer import Trainer, TrainerConfig
from engine.runtime.weights import WeightReceiver, WeightSender, manifest
from engine.runtime.worker import offload_rollout_for_training
from envs.base import Task, ToolResult

torch.set_num_threads(1)


def test_precision_per_device_kind():
    cpu = precision_for("cpu")
    assert (cpu.rollout_dtype, cpu.master_dtype, cpu.compute_dtype, cpu.mixed) == (torch.float32,) * 3 + (False,)
    assert fsdp_mp_policy(cpu) is None
    assert type(autocast(cpu, "cpu")).__name__ == "nullcontext"
    for kind in ("cuda", "npu"):
        p = precision_for(kind)
        assert (p.rollout_dtype, p.master_dtype, p.compute_dtype, p.reduce_dtype) == (
            torch.bfloat16, torch.float32, torch.bfloat16, torch.float32)
        policy = fsdp_mp_policy(p)
        assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)


def test_rollout_dtype_overrides_the_rollout_only(monkeypatch):
    import engine.precision as precision

    monkeypatch.setattr(precision, "cpu_has_bf16_matmul", lambda: True)
    cpu16 = precision_for("cpu", "bfloat16")
    assert (cpu16.rollout_dtype, cpu16.master_dtype, cpu16.compute_dtype) == (torch.bfloat16, torch.float32, torch.float32)
    assert precision_for("cuda", "float32").rollout_dtype == torch.float32 and precision_for("cuda", "float32").mixed
    assert precision_for("npu", "auto") == precision_for("npu")
    monkeypatch.setattr(precision, "cpu_has_bf16_matmul", lambda: False)
    with pytest.raises(RuntimeError, match=r"this CPU has no bf16 matmul .* use --rollout.dtype float32"):
        precision_for("cpu", "bfloat16")
    assert precision_for("cuda", "bfloat16").rollout_dtype == torch.bfloat16  # the check is for CPUs
    with pytest.raises(ValueError, match=r"RolloutConfig.dtype='fp8' is unknown; use one of \('auto', 'float32', 'bfloat16'\)"):
        RolloutConfig(dtype="fp8")


def test_cpu_trainer_keeps_fp32_and_offload_is_for_colocated_accelerators_only():
    model, _ = build_tiny(0)
    trainer = Trainer(model, TrainerConfig())
    assert not trainer.precision.mixed and all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert offload_rollout_for_training(True, "cuda") and offload_rollout_for_training(True, "npu")
    assert not offload_rollout_for_training(True, "cpu") and not offload_rollout_for_training(False, "cuda")


def _cast_send(ctx):
    group = dist.new_group([0, 1])
    g = torch.Generator().manual_seed(0)
    master = {"w": torch.randn(64, 8, generator=g), "ids": torch.arange(5), "b": torch.randn(8, generator=g)}
    if ctx.rank == 0:
        WeightSender(group, 0, bucket_size_mb=0.001, device=torch.device("cpu")).send(master, 3, dtype=torch.bfloat16)
        return None
    rollout_model = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in master.items()}
    recv = WeightReceiver(group, 0, manifest(rollout_model), bucket_size_mb=0.001, device=torch.device("cpu"))
    recv.recv()
    version, got = recv.weights.read()
    return version, all(torch.equal(got[k], v) and got[k].dtype == v.dtype for k, v in rollout_model.items())


def test_fp32_master_weights_reach_a_bf16_rollout_model():
    assert spawn(_cast_send, 2, device_info=DeviceInfo("cpu", 2), timeout_s=60)[1] == (3, True)


class _Episode:
    def execute(self, call):
        return ToolResult(tool="x", text="x", status="success")

    def score(self, final_text):
        return 0.0

    def close(self):
        pass


def _greedy(engine, tok, rid):
    msgs = ({"role": "user", "content": "Say the word red."},)
    engine.add(RolloutRequest(request_id=rid, task=Task(task_id=rid, bench="toy", messages=msgs, tools=()), episode=_Episode(),
                              prompt_ids=render_prompt(tok, msgs, ()), group_id="g"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # scoring runs on the tool pool: wait for it, not a step count
        for e in engine.step():
            if isinstance(e, Finished):
                return e.trajectory.token_ids
        engine.wait_for_tools(0.05)
    raise AssertionError("no trajectory finished within 60 s")


def _engine(device="cpu"):
    model, tok = build_tiny(0)
    cfg = RolloutConfig(temperature=0.0, max_new_tokens_per_turn=16, max_turns=1, tool_workers=1)
    return RolloutEngine(model.to(device), tok, cfg, device=device), tok


def test_offload_with_a_request_in_flight_rejoins_it_and_generation_is_unchanged_after_reload():
    """A time-shared hybrid rank offloads mid-turn: the running request loses its KV and rejoins after the reload
    (re-prefilled), and a greedy request decodes exactly as before the offload."""
    engine, tok = _engine()
    before = _greedy(engine, tok, "a")
    msgs = ({"role": "user", "content": "hi"},)
    engine.add(RolloutRequest(request_id="busy", task=Task(task_id="b", bench="toy", messages=msgs, tools=()),
                              episode=_Episode(), prompt_ids=render_prompt(tok, msgs, ()), group_id="other"))
    for _ in range(3):
        engine.step()
    assert engine.runner.rows == ["busy"]
    engine.offload()
    assert engine.runner.cache is None and not engine.runner.parked and not engine.runner.rows
    assert list(engine.ready) == ["busy"]  # it rejoins first
    engine.reload()
    deadline = time.monotonic() + 60
    while "busy" in engine.seqs and time.monotonic() < deadline:  # it finishes (scoring runs on the tool pool)
        engine.step()
        engine.wait_for_tools(0.05)
    assert "busy" not in engine.seqs
    assert _greedy(engine, tok, "c") == before
    engine.close()


@pytest.mark.gpu
def test_cuda_offload_frees_device_memory_and_reload_restores_it():
    engine, tok = _engine("cuda")
    before = _greedy(engine, tok, "a")
    held = torch.cuda.memory_allocated()
    engine.offload()
    assert engine.offloaded and torch.cuda.memory_allocated() < held
    engine.reload()
    assert _greedy(engine, tok, "b") == before
    engine.close()


@pytest.mark.gpu
def test_cuda_trainer_computes_in_bf16_with_fp32_master_weights():
    from tests.test_trainer import make_trajs

    model, _ = build_tiny(0)
    trainer = Trainer(model, TrainerConfig(lr=1e-2), device="cuda")
    assert trainer.precision.mixed
    metrics = trainer.train_step(make_trajs(), 0)
    assert metrics["train/stepped"] == 1.0 and torch.isfinite(torch.tensor(metrics["train/loss"]))
    assert all(p.dtype == torch.float32 and p.is_cuda for p in trainer.model.parameters())
