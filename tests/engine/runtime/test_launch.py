"""The launcher: results in rank order, a raising worker is named and nothing survives."""

import time

import psutil
import pytest

from engine.devices import DeviceInfo
from engine.runtime.launch import WorkerFailed, loss_note, spawn, stop_grace

CPU = DeviceInfo("cpu", 2)


def _echo(ctx, base):
    ctx.set_role("trainer" if ctx.rank % 2 else "rollout")
    return base + ctx.rank


def _raise_on_two(ctx):
    ctx.set_role("rollout")
    if ctx.rank == 2:
        raise ValueError("boom from a worker")
    time.sleep(60)  # the others would hang without the teardown


def _children():
    return [c for c in psutil.Process().children(recursive=True) if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_results_come_back_in_rank_order():
    assert spawn(_echo, 3, (10,), device_info=CPU, timeout_s=30) == [10, 11, 12]


def test_raising_worker_is_named_and_everything_is_torn_down():
    before = {c.pid for c in _children()}
    t0 = time.monotonic()
    with pytest.raises(WorkerFailed, match=r"rank 2 \(rollout\) failed: ValueError: boom from a worker"):
        spawn(_raise_on_two, 4, device_info=CPU, timeout_s=30)
    assert time.monotonic() - t0 < 10
    # the forkserver itself may stay (it is shared and exits with us); no rank may survive
    left = [c for c in _children() if c.pid not in before and "forkserver" not in " ".join(c.cmdline())]
    assert left == [], [c.cmdline() for c in left]


def _die_hard(ctx):
    import os
    import signal

    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


def test_killed_worker_is_detected():
    with pytest.raises(WorkerFailed, match=r"rank 1 .*exited with code -9"):
        spawn(_die_hard, 2, device_info=CPU, timeout_s=30)


def test_a_stop_waits_the_longer_of_the_grace_and_what_the_coordinator_measured_it_needs():
    assert stop_grace(20.0, None) == 20.0  # nothing measured yet: the configured grace
    assert stop_grace(20.0, "95.5") == 95.5  # a step and its checkpoint take longer than the grace
    assert stop_grace(20.0, "7") == 20.0
    assert stop_grace(0.0, "95.5") == 0.0  # no grace asked for: kill at once


def test_a_kill_says_what_it_loses():
    assert loss_note(None) == "no checkpoint was written yet, so a rerun starts from step 0"
    assert loss_note("3") == "`--resume` continues from the checkpoint of step 3; what trained after it is lost"


def test_a_first_layout_past_the_host_memory_is_warned_with_the_fix(caplog):
    from engine.runtime.run import warn_host_memory
    from scheduler.layout import Bucket, split_role_map
    from scheduler.profile import HardwareProfile, ProfiledCostModel

    def cost(host_mem_bytes: float) -> ProfiledCostModel:
        return ProfiledCostModel(HardwareProfile(
            model="tiny", arch="tiny", device="cpu", hardware="cpu", decode=((1, 128, 0.01),), prefill=((64, 0.01),),
            train_tokens_per_s={1: 1000.0}, sync_s=0.1, group_rebuild_s=0.1, reconfig_s=1.0,
            trainer_rss_bytes={1: 4e9}, rollout_rss_bytes=1e9, host_mem_bytes=host_mem_bytes))

    role_map = split_role_map(world_size=4, num_trainer=1, rollout_tp=(("short", 1),) * 3,
                              buckets=(Bucket(name="short", max_tokens=None),))
    warn_host_memory(cost(16e9), role_map)  # 7 GB of 16: quiet
    assert not caplog.records
    warn_host_memory(cost(8e9), role_map)
    assert "need ~7.0 GB at their peaks" in caplog.text and "of this host's 8.0 GB" in caplog.text
    assert "--nproc" in caplog.text


def test_the_forkserver_starts_before_planning_unless_a_profile_is_measured_first(tmp_path):
    """`start_ranks_early` (engine/runtime/run.py): a run whose profile is not cached measures it first, on quiet
    cores, so the forkserver waits for `spawn`; a run planning on the tables starts it at once, and it is gone
    when the launcher exits. In a fresh interpreter: this one's forkserver may already run."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = """
import multiprocessing.forkserver as fs
from config import parse_args
from engine.runtime.run import start_ranks_early
base = ["--model", "tiny", "--device", "cpu", "--system", "libra"]
start_ranks_early(parse_args(base))
print("miss", fs._forkserver._forkserver_pid)
start_ranks_early(parse_args([*base, "--planner.profile", "none"]))
print("none", fs._forkserver._forkserver_pid)
"""
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, LIBRA_PROFILE_DIR=str(tmp_path), PYTHONPATH=str(root))
    # at exit the launcher kills it mid-imports (else it would hold these pipes until its imports are done)
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    words = proc.stdout.split()
    assert words[:3] == ["miss", "None", "none"] and words[3].isdigit(), proc.stdout
    time.sleep(0.2)
    assert not psutil.pid_exists(int(words[3])) or psutil.Process(int(words[3])).status() == psutil.STATUS_ZOMBIE
