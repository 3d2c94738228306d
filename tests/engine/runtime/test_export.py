"""Export: a run's checkpoint -> a Hugging Face directory that transformers loads as the trained policy.

The run dir is built by hand (config.json + a checkpoint written by a real `Trainer` after one
GRPO step), so the test knows the trainer's exact weights; one slow test exports a real run.
"""

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import libra
from config import LibraConfig, RunConfig
from engine.runtime import checkpoint
from engine.chat import render_text
from engine.runtime.export import export_policy
from engine.models import build_tiny, render_prompt
from engine.rollout.engine import Finished, RolloutConfig, RolloutEngine, RolloutRequest
from engine.trainer.trainer import Trainer, TrainerConfig
from engine.trajectory import Trajectory
from envs.base import Task, ToolResult
from envs.toy import ECHO_TOOL
from steps.commands import RunState
from scheduler.systems import initial_role_map

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[3]
MESSAGES = ({"role": "system", "content": "Say the word."}, {"role": "user", "content": "Say the word gold."})


def _trajectories(prompt_len=4, n=4):
    gen = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        ids = torch.randint(0, 500, (prompt_len + 8,), generator=gen).tolist()
        out.append(Trajectory(request_id=f"r{i}", task_id="t0", group_id="g0", prompt_len=prompt_len, token_ids=ids,
                              loss_mask=[0] * prompt_len + [1] * 8, logprobs=[0.0] * (prompt_len + 8),
                              versions=[-1] * prompt_len + [0] * 8, reward=float(i % 2)))
    return out


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """(run dir, the trainer's weights after one step, the initial weights)."""
    run = tmp_path_factory.mktemp("run")
    LibraConfig(run=RunConfig(model="tiny", bench="toy", seed=0)).write(run / "config.json")
    model, _ = build_tiny(0)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(model, TrainerConfig(lr=1e-2, off_policy="recompute-all"))
    assert trainer.train_step(_trajectories(), 0)["train/stepped"] == 1.0
    state = RunState(step=1, policy_version=trainer.policy_version, role_map=initial_role_map("static", 2, allowed_tp=(1,)))
    checkpoint.save(run, state, lambda d, _what: torch.save(trainer.state_dict(), Path(d) / "trainer.pt"))
    return run, {k: v.clone() for k, v in trainer.full_state_dict().items()}, initial


def test_exported_weights_equal_the_trainers(trained_run, tmp_path):
    run, weights, initial = trained_run
    out = export_policy(run, tmp_path / "hf")
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert json.loads((out / "libra_export.json").read_text())["policy_version"] == 1
    loaded = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert set(loaded) == set(weights)
    for name, tensor in weights.items():
        assert torch.equal(loaded[name], tensor), name
    assert any(not torch.equal(initial[k], weights[k]) for k in weights), "the step must have changed the weights"


def test_the_export_has_the_modes_a_plain_write_gives(trained_run, tmp_path):
    """Not mkdtemp's 0700: whoever may read a folder the user makes may load the exported model."""
    mask = os.umask(0o022)
    try:
        out = export_policy(trained_run[0], tmp_path / "shared")
    finally:
        os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert {stat.S_IMODE(f.stat().st_mode) for f in out.iterdir()} == {0o644}


def test_export_generates_like_the_rollout_engine(trained_run, tmp_path):
    run, weights, _ = trained_run
    out = export_policy(run, tmp_path / "hf")
    model, tokenizer = build_tiny(0)
    prompt = render_prompt(tokenizer, MESSAGES, ())
    engine = RolloutEngine(model, tokenizer, RolloutConfig(temperature=0.0, max_new_tokens_per_turn=24, max_turns=1,
                                                           max_total_tokens=4096, tool_workers=1))
    engine.set_weights(weights, 1)

    class Episode:
        def execute(self, call):
            return ToolResult(tool="echo", text="x", status="success")

        def score(self, final_text):
            return 0.0

        def close(self):
            pass

    task = Task(task_id="t", bench="toy", messages=MESSAGES, tools=())
    engine.add(RolloutRequest(request_id="r", task=task, episode=Episode(), prompt_ids=prompt, group_id="g"))
    traj = None
    deadline = time.monotonic() + 60
    while traj is None and time.monotonic() < deadline:  # scoring runs on the tool pool
        traj = next((e.trajectory for e in engine.step() if isinstance(e, Finished)), None)
        engine.wait_for_tools(0.05)
    assert traj is not None, "no trajectory finished within 60 s"
    engine.close()
    start, end = traj.turns[0]
    rollout_tokens = traj.token_ids[start:end]
    assert rollout_tokens

    hf_tok = AutoTokenizer.from_pretrained(out)
    hf_model = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = hf_tok.apply_chat_template(list(MESSAGES), add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert list(ids) == prompt, "the exported tokenizer and chat template build the run's prompt"
    with torch.no_grad():
        gen = hf_model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                do_sample=False, max_new_tokens=len(rollout_tokens), pad_token_id=hf_tok.pad_token_id)
    assert gen[0, len(prompt):].tolist() == rollout_tokens


def test_chat_template_renders_the_training_text(trained_run, tmp_path):
    out = export_policy(trained_run[0], tmp_path / "hf")
    tok = AutoTokenizer.from_pretrained(out)
    chat = [*MESSAGES, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "echo", "arguments": {"text": "gold"}}}]},
            {"role": "tool", "content": "gold"}]
    assert tok.apply_chat_template(chat, tools=[ECHO_TOOL], add_generation_prompt=True, tokenize=False) == render_text(chat, [ECHO_TOOL])


def test_export_errors_are_one_line_and_leave_nothing(trained_run, tmp_path, caplog):
    run = trained_run[0]
    assert libra.main(["export", str(run), "--step", "7", "--to", str(tmp_path / "a")]) == 2
    assert "--step 7" in caplog.text and "its checkpoints are steps [1]" in caplog.text
    assert not (tmp_path / "a").exists()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    assert libra.main(["export", str(run), "--to", str(busy)]) == 2
    assert "is not an empty directory" in caplog.text and (busy / "keep.txt").read_text() == "mine"
    assert libra.main(["export", str(tmp_path), "--to", str(tmp_path / "b")]) == 2
    assert "is not a Libra run directory" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]


def test_cli_step_and_module_entry(trained_run, tmp_path):
    run = trained_run[0]
    assert libra.main(["export", str(run), "--step", "1", "--to", str(tmp_path / "a"), "--dtype", "bfloat16"]) == 0
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "a").dtype == torch.bfloat16
    proc = subprocess.run([sys.executable, "-m", "engine.runtime.export", str(run), "--to", str(tmp_path / "b")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "b" / "model.safetensors").is_file()


@pytest.mark.slow
def test_export_of_a_real_run(tmp_path):
    out = tmp_path / "run"
    assert libra.main(["--model", "tiny", "--device", "cpu", "--bench", "toy", "--steps", "1", "--nproc", "2",
                       "--system", "static", "--num-tasks", "4", "--rollout.max-new-tokens-per-turn", "8", "--out", str(out)]) == 0
    assert libra.main(["export", str(out), "--to", str(tmp_path / "hf")]) == 0
    saved = torch.load(checkpoint.latest(out) / "trainer.pt", map_location="cpu", weights_only=True)["model"]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in saved.items())
