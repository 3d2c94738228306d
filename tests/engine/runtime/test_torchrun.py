"""torchrun for real: the command of the README runs to the summary and trains the same tasks as our launcher.

`torchrun` is `python -m torch.distributed.run` (the same entry point); using the module form
runs the interpreter of this test, not whatever `torchrun` is first on PATH.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# libra's first design is chosen by every torchrun process alike (they place their own ranks); the hybrid's step
# batches train in admission order (finish-order batches would train in the order groups happen to finish)
ARGS = ["--model", "tiny", "--device", "cpu", "--steps", "2", "--planner.design", "libra-hybrid"]


def _env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", GLOO_SOCKET_IFNAME="lo")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(var, None)  # this test may itself run under a launcher
    return env


@pytest.mark.slow
def test_torchrun_trains_the_same_tasks_as_the_builtin_launcher(tmp_path):
    tr_out, own_out = tmp_path / "torchrun", tmp_path / "own"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "5",
           str(ROOT / "libra.py"), *ARGS, "--out", str(tr_out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=280)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    assert "== libra summary" in text
    assert text.count("[libra] run dir") == 1, "only global rank 0 writes the run dir and says so"
    own = subprocess.run([sys.executable, str(ROOT / "libra.py"), *ARGS, "--out", str(own_out)], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=200)
    assert own.returncode == 0, (own.stdout + own.stderr)[-4000:]

    tr, ref = (json.loads((d / "summary.json").read_text()) for d in (tr_out, own_out))
    assert tr["steps"] == ref["steps"] == 2 and tr["role_map_first"] == ref["role_map_first"]
    assert "colocated" in ref["role_map_first"], ref["role_map_first"]  # both started on the first design
    assert tr["trained_task_ids"] == ref["trained_task_ids"] and tr["trained_task_ids"]
    assert tr["ledger"]["started"] == tr["ledger"]["trained"] + sum(tr["ledger"]["dropped"].values())
    # every worker's result reaches the coordinator, as with our launcher
    assert len(tr["peak_rss_mb_per_rank"]) == len(ref["peak_rss_mb_per_rank"]) == 4
    assert all(mb > 0 for mb in tr["peak_rss_mb_per_rank"])
    assert sorted(p.name for p in (tr_out / "ranks").glob("rank*.json")) == [f"rank{r}.json" for r in range(1, 5)]
