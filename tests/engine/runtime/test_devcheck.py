"""bench/device_check.sh is valid bash, and its python parts (engine/runtime/devcheck.py) run on CPU."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.runtime.devcheck import main, rollout_speed, small_qwen, trainer_speed

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "bench" / "device_check.sh"


def test_script_is_valid_bash():
    assert shutil.which("bash")
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_small_qwen_saves_and_runs_the_checks_on_cpu(tmp_path, capsys):
    model, tok = small_qwen()
    assert model.config.model_type == "qwen2" and 1e6 < sum(p.numel() for p in model.parameters()) < 1e7
    assert main(["model", "--out", str(tmp_path / "m")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("small_qwen_params: ")
    r = rollout_speed(str(tmp_path / "m"), "cpu", num_requests=2, max_new_tokens=8)
    assert r["requests"] == 2 and 0 < r["model_tokens"] <= 16 and r["rollout_tokens_per_s"] > 0
    t = trainer_speed("tiny", "cpu", num_trajectories=4, seq_len=32, steps=1)
    assert t["tokens"] == 128 and t["trainer_tokens_per_s"] > 0 and t["compute"] == "torch.float32"


@pytest.mark.slow
def test_dry_run_on_cpu_prints_one_table_without_failures(tmp_path):
    env = dict(os.environ, DEVICE="cpu", PYTHON=sys.executable, WORK=str(tmp_path))
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[-1] == "device_check_failed: 0"
    table = [line.split()[0] for line in lines if line.split() and line.split()[0] in
             ("model", "gpu", "rollout", "trainer", "run", "export")]
    assert table == ["model", "gpu", "rollout", "trainer", "run", "export"]
