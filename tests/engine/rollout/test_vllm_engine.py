"""vLLM rollout backend (engine/rollout/vllm_engine.py) against the torch engine, on a tiny Qwen2 with head_dim 64.

Without vLLM only the start-up error tests run; the rest skip with the reason and the set-up command.
One vLLM engine (its engine core a spawned child process, start-up ~15 s on 2 cores) is shared by the module's
tests: each drives it to idle and puts back what it changed (weights, flags). The TP2 tests start their own: one
engine over two vLLM workers, and a whole `libra.py` run with a TP2 bucket instance (about 90 s).
"""

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.models import build_tiny, render_prompt, save_policy_dir
from engine.rollout.engine import RolloutConfig, RolloutEngine, RolloutRequest, ToolReturned
from scripted_model import Scripted
from rollout_helpers import FakeEpisode, make_script, run, task_for

torch.set_num_threads(1)
ROOT = str(Path(__file__).resolve().parents[3])

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed; set it up with `VENV=.venv-vllm LIBRA_VLLM=1 bash run.sh test`")
CFG = dict(temperature=0.0, max_new_tokens_per_turn=60, max_turns=4, max_total_tokens=400, max_batch=6, progress_every_tokens=16)


def test_missing_vllm_is_one_line_with_the_fix():
    """In a Python where `import vllm` finds nothing, the check names what is missing and the set-up command."""
    code = ("import sys, importlib.util as u; real = u.find_spec; "
            "u.find_spec = lambda n, *a: None if n == 'vllm' else real(n, *a); "
            "from engine.rollout.vllm_engine import check_vllm\n"
            "try:\n    check_vllm()\nexcept RuntimeError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    line = out.stdout.strip()
    assert line.startswith("--rollout.backend vllm: vLLM is not installed in ") and "LIBRA_VLLM=1 bash run.sh" in line, out
    assert "\n" not in line


def test_backend_flag_is_validated():
    with pytest.raises(ValueError, match=r"RolloutConfig.backend='sglang' must be one of torch, vllm"):
        RolloutConfig(backend="sglang")


def test_unsupported_layouts_are_refused_before_vllm_starts():
    from engine.models import load_config
    from engine.rollout.vllm_engine import check_layout

    config = load_config("tiny").to_dict()
    cfg = RolloutConfig(**CFG)
    with pytest.raises(ValueError, match=r"head_dim 16, which vLLM's CPU attention does not support"):
        check_layout(config, cfg, device_type="cpu", where="'tiny'")
    with pytest.raises(ValueError, match=r"--rollout.max-total-tokens 5000 exceeds the model's max_position_embeddings 4096"):
        check_layout(config, RolloutConfig(**{**CFG, "max_total_tokens": 5000}), device_type="cuda", where="'tiny'")


def test_a_tp_instance_engine_core_sees_exactly_its_devices(monkeypatch):
    from engine.rollout.vllm_engine import visible_devices_env

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_devices_env([]) == {}  # CPU: threads, no devices
    assert visible_devices_env(["node/cuda:2", "node/cuda:3"]) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")  # the rank's cuda:2 is physical device 6
    assert visible_devices_env(["node/cuda:2", "node/cuda:3"]) == {"CUDA_VISIBLE_DEVICES": "6,7"}
    with pytest.raises(ValueError, match="beyond CUDA_VISIBLE_DEVICES=4,5,6,7"):
        visible_devices_env(["node/cuda:4"])
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    assert visible_devices_env(["node/npu:0", "node/npu:1"]) == {"ASCEND_RT_VISIBLE_DEVICES": "0,1"}


def test_libra_with_the_vllm_backend_fails_at_start_up_in_one_line(tmp_path):
    """`python libra.py --rollout.backend vllm`: without vLLM, one line naming it and the set-up command; with it,
    the tiny model (head_dim 16) is refused in one line. Either way before any rank starts or the run dir exists."""
    from cli_helpers import RUN, fails as _fails

    out = tmp_path / "run"
    args = ("--bench", "toy", "--model", "tiny", "--rollout.backend", "vllm", "--out", str(out), *RUN)
    if HAS_VLLM:
        line = _fails(2, *args)
        assert "head_dim 16, which vLLM's CPU attention does not support" in line and "--model smollm2" in line, line
    else:
        line = _fails(1, *args)
        assert line.startswith("--rollout.backend vllm: vLLM is not installed in ") and "LIBRA_VLLM=1 bash run.sh" in line, line
    assert not out.exists()


# ---- with vLLM -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny64(tmp_path_factory):
    model, tok = build_tiny(0, head_dim=64)
    return model, tok, save_policy_dir(model, tok, tmp_path_factory.mktemp("vllm") / "tiny64")


@pytest.fixture(scope="module")
def vllm_engine(tiny64):
    from engine.rollout.vllm_engine import VllmRolloutEngine
    from engine.rollout.vllm_script import ScriptLogits

    model, tok, path = tiny64
    script = make_script(tok)
    eng = VllmRolloutEngine(path, tok, RolloutConfig(**CFG), kv_cache_mb=64, engine_kwargs={"logits_processors": [ScriptLogits], "block_size": 32},
                            sampling_extra_args={"libra_script": script, "libra_bias": 30.0})
    yield eng
    eng.close()


def requests(tok, n, rng):
    return [RolloutRequest(f"r{i}", task_for(i), FakeEpisode(rng.choice([0.0, 0.003])),
                           render_prompt(tok, task_for(i).messages, ()), "g") for i in range(n)]


def plain_requests(tok, n, prefix="p"):
    return [RolloutRequest(f"{prefix}{i}", task_for(i), FakeEpisode(), render_prompt(tok, task_for(i).messages, ()), "g") for i in range(n)]


def unscripted(eng):
    """The shared engine with its script switched off (the processor returns None without one)."""
    class Off:
        def __enter__(self):
            self.saved, eng.runner.extra_args = eng.runner.extra_args, None

        def __exit__(self, *exc):
            eng.runner.extra_args = self.saved

    return Off()


@needs_vllm
def test_greedy_tokens_and_logprobs_equal_the_torch_engine(tiny64, vllm_engine):
    model, tok, _ = tiny64
    ref, _ = run(RolloutEngine(model, tok, RolloutConfig(**CFG), device="cpu"), plain_requests(tok, 4))
    with unscripted(vllm_engine):
        got, _ = run(vllm_engine, plain_requests(tok, 4))
    assert set(got) == set(ref)
    for rid, traj in got.items():
        assert traj.token_ids == ref[rid].token_ids and traj.loss_mask == ref[rid].loss_mask, rid
        assert traj.num_model_tokens > 0 and traj.policy_versions == [0] and traj.finish_reason == ref[rid].finish_reason
        assert max(abs(a - b) for a, b in zip(traj.logprobs, ref[rid].logprobs)) < 1e-3


def test_logprobs_mode_is_the_full_distribution_at_the_temperature_or_refused():
    from engine.rollout.vllm_engine import check_layout, logprobs_mode

    assert logprobs_mode(RolloutConfig(temperature=0.7, top_p=1.0)) == "processed_logprobs"  # after temperature
    assert logprobs_mode(RolloutConfig(temperature=0.0, top_p=0.5)) == "processed_logprobs"  # greedy ignores top_p
    assert logprobs_mode(RolloutConfig(temperature=1.0, top_p=0.5)) == "raw_logprobs"  # before the nucleus
    with pytest.raises(ValueError, match=r"--rollout.temperature 0.7 and --rollout.top-p 0.9: .* use --rollout.top-p 1, "
                                         r"--rollout.temperature 1, or --rollout.backend torch"):
        check_layout({"num_attention_heads": 4, "hidden_size": 256}, RolloutConfig(temperature=0.7, top_p=0.9),
                     device_type="cpu", where="'tiny64'")


@needs_vllm
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_nucleus_sampled_logprobs_are_the_trainers_full_distribution(tiny64, temperature):
    """vLLM with top_p < 1 (temperature 1) or a temperature (top_p 1) records what the trainer computes."""
    from engine.trainer.algos import token_logprobs
    from engine.rollout.vllm_engine import VllmRolloutEngine

    model, tok, path = tiny64
    top_p = 0.5 if temperature == 1.0 else 1.0
    cfg = RolloutConfig(**{**CFG, "temperature": temperature, "top_p": top_p, "max_new_tokens_per_turn": 12})
    eng = VllmRolloutEngine(path, tok, cfg, kv_cache_mb=64, engine_kwargs={"block_size": 32})
    try:
        got, _ = run(eng, plain_requests(tok, 3, prefix="n"))
    finally:
        eng.close()
    for traj in got.values():
        ids = torch.tensor([traj.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        want = token_logprobs(logits[0, :-1], ids[0, 1:], temperature=temperature)
        model_tokens = [i for i in range(1, traj.num_tokens) if traj.loss_mask[i]]
        assert model_tokens and max(abs(want[i - 1].item() - traj.logprobs[i]) for i in model_tokens) < 1e-3


@needs_vllm
def test_multi_turn_tool_trajectory_equals_the_torch_engine(tiny64, vllm_engine):
    model, tok, _ = tiny64
    ref, _ = run(RolloutEngine(Scripted(model, make_script(tok)), tok, RolloutConfig(**CFG), device="cpu"), requests(tok, 3, random.Random(0)))
    got, seen = run(vllm_engine, requests(tok, 3, random.Random(0)))
    for rid, traj in got.items():
        # a good call, a malformed one, then eos: three model turns, tool output masked 0
        assert len(traj.turns) == 3 and traj.finish_reason == "stop", (rid, traj.turns, traj.finish_reason)
        assert traj.tool_outcomes == [("calc", "small", "success"), ("<parse>", "small", "failure")] and traj.reward == 2.0
        assert traj.token_ids == ref[rid].token_ids and traj.loss_mask == ref[rid].loss_mask and traj.turns == ref[rid].turns
        assert max(abs(a - b) for a, b in zip(traj.logprobs, ref[rid].logprobs)) < 1e-3
        assert all(traj.loss_mask[i] == 0 for i in range(traj.turns[0][1], traj.turns[1][0]))
    assert sum(isinstance(e, ToolReturned) for e in seen) == 6


@needs_vllm
@pytest.mark.parametrize("direction", ["vllm_to_torch", "torch_to_vllm"])
def test_migration_between_engines_gives_the_uninterrupted_tokens(tiny64, vllm_engine, direction):
    model, tok, _ = tiny64
    torch_eng = RolloutEngine(Scripted(model, make_script(tok)), tok, RolloutConfig(**CFG), device="cpu", instance_id=1)
    alone, _ = run(RolloutEngine(Scripted(model, make_script(tok)), tok, RolloutConfig(**CFG), device="cpu"), requests(tok, 3, random.Random(3)))
    src, dst = (vllm_engine, torch_eng) if direction == "vllm_to_torch" else (torch_eng, vllm_engine)
    reqs = requests(tok, 3, random.Random(3))
    done, _ = run(src, reqs, migrate_to=dst, migrate={"r1", "r2"})
    assert set(done) == {"r0", "r1", "r2"}
    for rid, traj in done.items():
        assert traj.token_ids == alone[rid].token_ids and traj.loss_mask == alone[rid].loss_mask and traj.turns == alone[rid].turns
    assert len(done["r1"].instances) == 2 and len(done["r0"].instances) == 1


@needs_vllm
def test_set_weights_changes_the_output_in_place(tiny64, vllm_engine):
    model, tok, _ = tiny64
    other, _ = build_tiny(1, head_dim=64)
    llm = vllm_engine.llm
    with unscripted(vllm_engine):
        before, _ = run(vllm_engine, plain_requests(tok, 1, "a"))
        vllm_engine.add(plain_requests(tok, 1, "w")[0])
        for _ in range(10):
            vllm_engine.step()
        vllm_engine.set_weights(dict(other.state_dict()), 7)
        mixed, _ = run(vllm_engine, [])
        after, _ = run(vllm_engine, plain_requests(tok, 1, "b"))
        ref, _ = run(RolloutEngine(other, tok, RolloutConfig(**CFG), device="cpu"), plain_requests(tok, 1, "c"))
        vllm_engine.set_weights(dict(model.state_dict()), 0)  # the shared engine's weights (and their cached KV) back
        vllm_engine.step()
    assert vllm_engine.llm is llm  # no restart
    assert mixed["w0"].policy_versions == [0, 7]
    assert after["b0"].token_ids != before["a0"].token_ids and after["b0"].policy_versions == [7]
    assert after["b0"].token_ids == ref["c0"].token_ids  # the new weights, not a mix (no stale prefix-cache hit)


@needs_vllm
@pytest.mark.parametrize("recompute", [False, True])
def test_an_update_recomputes_in_flight_kv_only_when_asked(tiny64, vllm_engine, recompute):
    """As the torch engine (tests/engine/rollout/test_rollout.py): after an update, a running request's tokens are sampled by the new
    weights; with recompute (AReaL) over KV recomputed with them, so their log-probs equal a teacher-forced pass of
    the new model; without it (partial rollout) over the old KV of its whole blocks, so they do not."""
    model, tok, _ = tiny64
    new, _ = build_tiny(1, head_dim=64)
    vllm_engine.recompute_kv_on_update, recomputed = recompute, vllm_engine.num_recomputed
    try:
        with unscripted(vllm_engine):
            vllm_engine.add(plain_requests(tok, 1, "k")[0])
            for _ in range(40):  # 9 prompt tokens + 40: past one whole KV block (32 here), the unit vLLM caches
                vllm_engine.step()
            vllm_engine.set_weights(dict(new.state_dict()), 7)
            traj = run(vllm_engine, [])[0]["k0"]
            vllm_engine.set_weights(dict(model.state_dict()), 0)
            vllm_engine.step()
    finally:
        vllm_engine.recompute_kv_on_update = False
    assert traj.policy_versions == [0, 7] and vllm_engine.num_recomputed - recomputed == int(recompute)
    ids = torch.tensor([traj.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(new(input_ids=ids, position_ids=torch.arange(ids.shape[1])[None]).logits[0, :-1], -1)
    after = [i for i in range(traj.prompt_len, traj.num_tokens) if traj.versions[i] == 7]
    gap = max(abs(logp[i - 1, traj.token_ids[i]].item() - traj.logprobs[i]) for i in after)
    assert (gap < 1e-3) == recompute, gap


@needs_vllm
def test_smollm2_greedy_equals_the_torch_engine():
    """The packaged SmolLM2-135M in fp32 on both engines: the same greedy tokens, log-probs within 1e-3."""
    from engine.models import load_policy, smollm2_dir
    from engine.rollout.vllm_engine import VllmRolloutEngine

    model, tok = load_policy("smollm2")
    cfg = RolloutConfig(temperature=0.0, max_new_tokens_per_turn=48, max_turns=1, max_total_tokens=1024, max_batch=4)
    questions = ["What is 12 + 7?", "Name the capital of France.", "Write a haiku about rivers."]

    def reqs():
        return [RolloutRequest(f"s{i}", task_for(i), FakeEpisode(), render_prompt(tok, ({"role": "user", "content": q},), ()), "g")
                for i, q in enumerate(questions)]

    ref, _ = run(RolloutEngine(model, tok, cfg, device="cpu"), reqs())
    eng = VllmRolloutEngine(smollm2_dir(), tok, cfg, kv_cache_mb=256)
    try:
        got, _ = run(eng, reqs())
    finally:
        eng.close()
    for rid, traj in got.items():
        assert traj.token_ids == ref[rid].token_ids, (rid, tok.decode(traj.token_ids[traj.prompt_len:]), tok.decode(ref[rid].token_ids[ref[rid].prompt_len:]))
        assert max(abs(a - b) for a, b in zip(traj.logprobs, ref[rid].logprobs)) < 1e-3


@needs_vllm
def test_a_tp2_instance_is_one_engine_over_two_workers(tiny64):
    """A TP2 bucket instance on vLLM: one engine with tensor_parallel_size=2 (two workers in vLLM's own world, one
    thread each, as two ranks' cores): the torch engine's greedy tokens, and a weight update reaches both shards."""
    from engine.rollout.vllm_engine import VllmRolloutEngine

    model, tok, path = tiny64
    other, _ = build_tiny(1, head_dim=64)
    ref, _ = run(RolloutEngine(model, tok, RolloutConfig(**CFG), device="cpu"), plain_requests(tok, 3))
    ref_new, _ = run(RolloutEngine(other, tok, RolloutConfig(**CFG), device="cpu"), plain_requests(tok, 1, "n"))
    eng = VllmRolloutEngine(path, tok, RolloutConfig(**CFG), kv_cache_mb=64, tensor_parallel_size=2, threads=1,
                            engine_kwargs={"block_size": 32})
    try:
        got, _ = run(eng, plain_requests(tok, 3))
        eng.set_weights(dict(other.state_dict()), 5)
        new, _ = run(eng, plain_requests(tok, 1, "n"))
    finally:
        eng.close()
    assert {rid: t.token_ids for rid, t in got.items()} == {rid: t.token_ids for rid, t in ref.items()}
    assert new["n0"].token_ids == ref_new["n0"].token_ids and new["n0"].policy_versions == [5]


@needs_vllm
def test_libra_runs_a_tp2_bucket_instance_on_vllm(tiny64, tmp_path):
    """`libra.py --rollout.backend vllm` with a TP2 long bucket (4 ranks: trainer, short TP1, long TP2): the long
    instance is one vLLM engine over both its ranks (its follower runs none), takes trajectories, trains and syncs."""
    _, _, path = tiny64
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "libra.py", "--bench", "toy", "--model", str(path), "--rollout.backend", "vllm",
                           "--device", "cpu", "--nproc", "4", "--steps", "2", "--system", "libra", "--planner.allowed-tp", "1,2",
                           "--planner.profile", "none", "--rollout.vllm-kv-cache-mb", "64", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert "long:TP2x1" in summary["role_map_first"] and summary["ledger"]["trained"] == summary["ledger"]["started"] > 0, summary
    long_ = [json.loads(x)["instances"] for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert any(1 in inst for inst in long_), long_  # instance 1: the TP2 long bucket's
    roles = [json.loads(p.read_text())["role"] for p in sorted((out / "ranks").glob("rank*.json"))]
    assert sum("TP2" in r for r in roles) == 2, roles
