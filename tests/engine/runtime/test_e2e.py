"""End to end on CPU with the tiny model: every system on every bench, migrations, role changes,
the ledger, resume after SIGKILL, and rank faults.

Runs go through `libra.main` in this process where possible (the forkserver, once warm, makes a
run cost seconds), and through a `python libra.py` subprocess where the test kills things.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import libra
from engine.runtime import checkpoint
from logger_helpers import read_scalars
from runlog import METRIC_FIELDS, SUMMARY_FIELDS, read_metrics
from scheduler.systems import SYSTEMS

ROOT = Path(__file__).resolve().parents[3]
SMALL = ["--model", "tiny", "--device", "cpu", "--nproc", "4", "--step.prompts-per-step", "2",
         "--step.samples-per-prompt", "2", "--rollout.max-new-tokens-per-turn", "12", "--rollout.max-turns", "2",
         "--rollout.progress-every-tokens", "4", "--num-tasks", "8"]
REAL_SYSTEMS = [name for name, spec in SYSTEMS.items() if not spec.sim_only]


def run_libra(tmp_path: Path, *args: str) -> tuple[dict, list[dict]]:
    out = tmp_path / "run"
    rc = libra.main([*SMALL, "--out", str(out), *args])
    assert rc == 0, f"libra exited {rc}"
    return json.loads((out / "summary.json").read_text()), read_metrics(out)


def test_a_hybrid_run_trains_and_generates_on_the_same_ranks_one_step_ahead(tmp_path):
    """libra-hybrid: every rank trains and hosts a rollout instance; the next step's trajectories are
    generated while a batch trains (lag 1, some spanning the update), never more than the bound."""
    summary, metrics = run_libra(tmp_path, "--bench", "math", "--system", "libra-hybrid", "--steps", "4")
    check_outputs(summary, metrics, 4)
    assert all(row["role_map"]["trainer"] == 4 and row["role_map"]["rollout"] == 4 for row in metrics)  # colocated
    assert all(row["staleness_max"] <= 1 for row in metrics)
    assert sum(row.get("trajectories_at_lag/1", 0) for row in metrics) >= 4  # step 2 was generated during step 1


@pytest.mark.parametrize("design, lag", [("libra-hybrid", 1), ("colocate", 0), ("libra-partial", 1)])
def test_libra_moves_to_another_design_mid_run(tmp_path, design, lag):
    """The design planner (scheduler/design_planner.py) on real ranks: after step 1 on the split, libra moves
    to the design --planner.design allows, and the step core runs its lookahead and batching from there.
    Finish-order batches run at a lag below their trained-lag bound: 1 under a bound of 2."""
    summary, metrics = run_libra(tmp_path, "--bench", "math", "--system", "libra", "--steps", "4", "--planner.first-design",
                                 "split", "--planner.design", design, "--planner.min-history-trajectories", "1",
                                 "--step.max-staleness", "2" if design == "libra-partial" else "1")
    check_outputs(summary, metrics, 4)
    assert summary["ledger"]["trained"] == 16 and summary["role_map_changes"] == 1
    colocated = design != "libra-partial"
    assert [row["role_map"]["trainer"] == 4 for row in metrics] == [False] + [colocated] * 3
    # from step 3 on, every trajectory was admitted on the new design, and it ran at the design's lag. Step batches
    # train none past it; finish-order batches none past their bound (2): a group the batches pass over trains
    # later, one that finishes within its own step sooner
    lags = [int(k.split("/")[1]) for row in metrics[2:] for k in row if k.startswith("trajectories_at_lag/")]
    assert lag in lags and max(lags) <= (2 if design == "libra-partial" else lag), lags
    assert max(row["staleness_max"] for row in metrics) <= (2 if design == "libra-partial" else 1)


def test_libra_starts_on_its_first_design_colocated_and_time_shared(tmp_path):
    """The launcher ranks libra's designs before step 1 (engine/runtime/run.py `first_design`): allowed only the
    hybrid, the run starts colocated with the next step generated while a batch trains, and never moves."""
    summary, metrics = run_libra(tmp_path, "--bench", "math", "--system", "libra", "--steps", "3",
                                 "--planner.design", "libra-hybrid")
    check_outputs(summary, metrics, 3)
    assert summary["role_map_changes"] == 0 and summary["planner_notes"][0][0] == 0
    assert all(row["role_map"]["trainer"] == 4 and row["role_map"]["rollout"] == 4 for row in metrics)
    assert max(row["staleness_max"] for row in metrics) <= 1 and sum(row.get("trajectories_at_lag/1", 0) for row in metrics)


def test_idle_rollout_instances_join_training(tmp_path):
    """Elastic joins on real ranks: on-policy step batches (lag 0, libra's split held) leave every rollout instance
    idle while a batch trains, so the step core offers them and the planner adds them where the cost model says it
    pays; each trained step reports its helpers, and every trajectory is still trained exactly once."""
    summary, metrics = run_libra(tmp_path, "--system", "libra-no-design", "--env", "examples.digits_env:DigitEnv",
                                 "--rollout.max-turns", "1", "--step.samples-per-prompt", "4",  # digits: rewards differ
                                 "--steps", "3", "--step.max-staleness", "0")
    check_outputs(summary, metrics, 3)
    assert summary["ledger"]["trained"] == summary["ledger"]["started"] == 24
    trained = [row for row in metrics if row.get("train/stepped")]
    assert trained and all(row["train/elastic_helpers"] >= 1 for row in trained), \
        [(row["step"], row.get("train/elastic_helpers")) for row in metrics]


def check_outputs(summary: dict, metrics: list[dict], steps: int) -> None:
    assert summary["mode"] == "real" and summary["steps"] == steps
    assert all(k in summary for k in SUMMARY_FIELDS)
    assert all(all(k in row for k in METRIC_FIELDS) for row in metrics)
    ledger = summary["ledger"]
    assert ledger["started"] == ledger["trained"] + sum(ledger["dropped"].values())
    assert ledger["trained"] > 0


# every system on the main bench; every bench with one system of each kind (a split with its planner, colocated,
# a fixed split): a system's scheduling does not depend on the bench, a bench's plumbing does not on the system
@pytest.mark.parametrize("system, bench", [(s, "swe") for s in REAL_SYSTEMS]
                         + [(s, b) for s in ("libra", "colocate", "static") for b in ("search", "math")])
def test_every_system_runs_three_steps_on_every_bench(tmp_path, system, bench):
    summary, metrics = run_libra(tmp_path, "--bench", bench, "--system", system, "--steps", "3")
    check_outputs(summary, metrics, 3)
    assert summary["system"] == system and summary["bench"] == bench
    # the continuous peers bound staleness at admission instead: a group the batches pass over trains later (lag 2
    # seen). Libra's finish-order designs bound the trained lag (steps/finish_order.py)
    if not SYSTEMS[system].batch_by_finish:
        assert max(row["staleness_max"] for row in metrics) <= 1
    if not SYSTEMS[system].elastic:  # only a system whose planner decides lends idle instances to training
        assert not any(row.get("train/elastic_helpers") for row in metrics)
    if system == "libra":  # its first design, chosen before step 1 on the prompts at the caps, is the layout it starts on
        (step, note), *_ = summary["planner_notes"]
        assert step == 0 and note.startswith("started on the design"), summary["planner_notes"]
        assert metrics[0]["role_map_desc"].split(" ", 1)[1] in note or "colocated" in note, (metrics[0]["role_map_desc"], note)


def test_libra_migrates_and_moves_ranks(tmp_path):
    # short bucket just above the prompt: trajectories outgrow it (demotion) and migrate; a tight
    # ratio band and no minimum gain make the planner re-plan at the first step boundary
    summary, metrics = run_libra(
        tmp_path, "--bench", "swe", "--system", "libra", "--steps", "3", "--rollout.max-new-tokens-per-turn", "40",
        "--buckets.max-tokens", "1500,1800", "--planner.ratio-band", "0.99,1.01", "--planner.min-gain-ratio", "0",
        "--planner.interval-steps", "1", "--planner.min-history-trajectories", "1", "--planner.settle-steps", "0",
        "--planner.allowed-tp", "1,2",  # keep a TP2 instance in the loop: TP must work on gloo
        "--planner.first-design", "split",  # start on the two buckets the flags above size
        "--run.loggers", "console,tensorboard")
    check_outputs(summary, metrics, 3)
    assert summary["migrations"] >= 1
    assert summary["role_map_changes"] >= 1
    assert len({row["role_map_desc"] for row in metrics}) >= 2
    out = tmp_path / "run"
    trace = json.loads((out / "trace.json").read_text())
    assert any(e["name"].startswith("reconfigure") for e in trace["traceEvents"])
    sample = [json.loads(x) for x in (out / "trajectories_sample.jsonl").read_text().splitlines()]
    assert sample and all("completion" in s for s in sample)
    scalars = read_scalars(out / "tensorboard")  # the same rows, under slash keys
    assert [s for s, _ in scalars["timing/step_s"]] == [1, 2, 3] and "train/loss" in scalars
    assert (out / "plot.png").is_file()  # the run draws its steps, and its story says why the planner moved
    assert any(note.startswith("moved to ") for _, note in summary["planner_notes"]), summary["planner_notes"]


@pytest.mark.skipif(not __import__("engine.precision").precision.cpu_has_bf16_matmul(), reason="this CPU has no bf16 matmul")
def test_a_bf16_rollout_on_cpu_trains_and_syncs_weights(tmp_path):
    """--rollout.dtype bfloat16: rollout models in bf16, the trainer in fp32, each sync cast to bf16 on the way."""
    summary, metrics = run_libra(tmp_path, "--bench", "search", "--system", "static", "--steps", "3", "--rollout.dtype", "bfloat16")
    check_outputs(summary, metrics, 3)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["rollout"]["dtype"] == "bfloat16"


@pytest.mark.slow
def test_checkpoints_come_by_run_time_and_only_the_newest_are_kept(tmp_path):
    """The default is a checkpoint every 10 minutes of run time; here every 0.6 ms, shorter than any real
    step (a fast machine runs this whole job in 0.3 s), so every step is due and --step.keep-checkpoints 2
    leaves the last two."""
    summary, _ = run_libra(tmp_path, "--bench", "search", "--system", "static", "--steps", "6",
                           "--step.checkpoint-every-min", "0.00001")
    kept = sorted(p.name for p in (tmp_path / "run" / "ckpt").iterdir())
    assert kept == ["step-000005", "step-000006"], kept
    assert summary["steps"] == 6


def _spawn(out: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # a run as a user starts it from a terminal: SIGINT at its default even where this suite inherited it ignored
    # (a background job's, `bash run.sh test &`), which Python would keep and the stop tests' Ctrl-C would not stop
    return subprocess.Popen([sys.executable, str(ROOT / "libra.py"), *SMALL, "--bench", "search", "--out", str(out), *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_until(pred, timeout_s: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert proc.poll() is None, f"libra exited early ({proc.returncode}):\n{proc.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, "timed out waiting for the run"
        time.sleep(0.2)


def _survivors(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _tree(proc: subprocess.Popen) -> list[int]:
    return [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]


def _metric_rows(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.slow
def test_resume_after_sigkill_trains_the_same_tasks(tmp_path):
    common = ("--steps", "12", "--system", "static", "--step.checkpoint-every", "1")
    ref = tmp_path / "ref"
    proc = _spawn(ref, *common)
    assert proc.wait(timeout=300) == 0, proc.stdout.read()[-3000:]
    expected = json.loads((ref / "summary.json").read_text())["trained_task_ids"]

    out = tmp_path / "killed"
    proc = _spawn(out, *common, "--steps", "200")  # killed long before its end (--resume runs it to 12)
    _wait_until(lambda: (c := checkpoint.latest(out)) is not None and checkpoint.load(c).step >= 3, 240, proc)
    pids = _tree(proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    time.sleep(1.0)
    assert _survivors(pids) == []
    ckpt = checkpoint.load(checkpoint.latest(out))
    assert 3 <= ckpt.step < 12, f"killed at step {ckpt.step}: too late to test a resume"
    ckpt_wall_s = ckpt.wall_s
    resumed = subprocess.run([sys.executable, str(ROOT / "libra.py"), *SMALL, "--bench", "search", *common,
                              "--resume", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trained_task_ids"] == expected

    # the record stays true over both segments: one row per step on one clock, throughput over the run
    rows = read_metrics(out)
    assert [m["step"] for m in rows] == list(range(1, 13)) and summary["steps"] == 12
    assert summary["resumed_from_step"] == ckpt.step
    times = [m["time_s"] for m in rows]
    assert times == sorted(times) and times[ckpt.step] > ckpt_wall_s
    assert summary["tokens"] == sum(m["tokens"] for m in rows)
    assert summary["wall_s"] >= times[-1] > ckpt_wall_s
    assert summary["tokens_per_s"] == pytest.approx(summary["tokens"] / summary["wall_s"])
    ledger = summary["ledger"]
    assert ledger["trained"] == 12 * 4 and ledger["started"] == ledger["trained"] + sum(ledger["dropped"].values())
    samples = [json.loads(x)["step"] for x in (out / "trajectories_sample.jsonl").read_text().splitlines()]
    assert sorted(samples) == samples and max(samples.count(k) for k in set(samples)) <= 2  # trajectories_logged_per_step
    spans = [e for e in json.loads((out / "trace.json").read_text())["traceEvents"] if e["name"].startswith("train step")]
    assert sorted(e["name"] for e in spans) == sorted(f"train step {k}" for k in range(1, 13))
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == ["step-000011", "step-000012"]  # --step.keep-checkpoints 2


@pytest.mark.slow
@pytest.mark.parametrize("role", ["rollout", "trainer"])
def test_killed_rank_ends_the_run_with_the_rank_named(tmp_path, role):
    out = tmp_path / "run"
    proc = _spawn(out, "--steps", "50", "--system", "static")
    _wait_until(lambda: _metric_rows(out) >= 1, 240, proc)
    victim = next(json.loads(p.read_text()) for p in sorted((out / "ranks").glob("rank*.json"))
                  if json.loads(p.read_text())[role])
    pids = _tree(proc)
    t0 = time.monotonic()
    os.kill(victim["pid"], signal.SIGKILL)
    rc = proc.wait(timeout=30)
    assert time.monotonic() - t0 < 30
    text = proc.stdout.read()
    assert rc != 0
    assert f"rank {victim['rank']} ({role}" in text, text[-2000:]
    time.sleep(1.0)
    assert _survivors(pids) == []


def _rank_of(out: Path, role: str) -> dict:
    return next(json.loads(p.read_text()) for p in sorted((out / "ranks").glob("rank*.json")) if json.loads(p.read_text())[role])


@pytest.mark.slow
def test_a_stopped_rank_is_named_and_the_run_goes_on_when_it_is_back(tmp_path):
    out = tmp_path / "run"
    proc = _spawn(out, "--steps", "60", "--system", "static", "--launch.straggler-s", "2")
    _wait_until(lambda: _metric_rows(out) >= 2, 240, proc)
    victim = _rank_of(out, "rollout")
    os.kill(victim["pid"], signal.SIGSTOP)
    assert _metric_rows(out) < 60, "the run ended before the fault: give it more steps"
    time.sleep(8.0)
    os.kill(victim["pid"], signal.SIGCONT)
    assert proc.wait(timeout=240) == 0
    text = proc.stdout.read()
    assert f"rank {victim['rank']} ({victim['role']}) sent no heartbeat for" in text, text[-3000:]
    assert f"rank {victim['rank']} ({victim['role']}) is back after" in text, text[-3000:]
    assert json.loads((out / "summary.json").read_text())["steps"] == 60


@pytest.mark.slow
def test_a_rank_stopped_past_the_rank_timeout_ends_the_run_with_the_checkpoint_intact(tmp_path):
    out = tmp_path / "run"
    proc = _spawn(out, "--steps", "200", "--system", "static", "--step.checkpoint-every", "1",
                  "--launch.straggler-s", "2", "--launch.rank-timeout-s", "6")
    # a step's metrics row is written before its checkpoint: the third row means step 2's checkpoint is complete
    # (stopping the trainer after the second row could catch it mid-save: step 1 then is, rightly, the latest)
    _wait_until(lambda: _metric_rows(out) >= 3, 240, proc)
    victim = _rank_of(out, "trainer")
    pids = _tree(proc)
    t0 = time.monotonic()
    os.kill(victim["pid"], signal.SIGSTOP)
    rc = proc.wait(timeout=60)
    assert time.monotonic() - t0 < 20
    text = proc.stdout.read()
    assert rc == 1 and f"rank {victim['rank']} ({victim['role']}) sent no heartbeat for" in text, text[-3000:]
    assert "it is hung" in text
    ckpt = checkpoint.latest(out)
    assert ckpt is not None and (ckpt / "trainer.pt").is_file() and checkpoint.load(ckpt).step >= 2
    time.sleep(1.0)
    assert _survivors(pids) == []


@pytest.mark.slow
@pytest.mark.parametrize("sig, to", [(signal.SIGTERM, "launcher"), (signal.SIGHUP, "launcher"), (signal.SIGINT, "launcher"),
                                     (signal.SIGTERM, "group"), (signal.SIGTERM, "every process")])
def test_a_stop_signal_checkpoints_the_last_step_and_ends_cleanly(tmp_path, sig, to):
    """kill, docker stop (the launcher), a closed terminal or kill -PGID (its group), systemd or Slurm (every
    process): one line naming the signal, the shell's exit code for it, a checkpoint of the last trained
    step, the trace and the summary written, every rank gone, and none of the peers' native stack traces."""
    out = tmp_path / "run"
    proc = _spawn(out, "--steps", "200", "--system", "static")
    _wait_until(lambda: _metric_rows(out) >= 2, 240, proc)
    pids = _tree(proc)
    t0 = time.monotonic()
    if to == "launcher":
        os.kill(proc.pid, sig)
    elif to == "group":
        os.killpg(proc.pid, sig)
    else:
        for pid in pids:
            os.kill(pid, sig)
    rc = proc.wait(timeout=60)
    assert time.monotonic() - t0 < 25  # the default grace is 20 s; a tiny step boundary takes about one
    text = proc.stdout.read()
    assert rc == 128 + sig, text[-2000:]
    name = signal.Signals(sig).name
    assert f"libra: stopped by {name}; its last trained step is checkpointed" in text, text[-2000:]
    assert "Traceback" not in text and "recvValue" not in text, text[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_by"] == name and summary["steps"] == _metric_rows(out) >= 2
    assert (out / "ckpt" / f"step-{summary['steps']:06d}" / "COMPLETE").is_file()
    assert json.loads((out / "trace.json").read_text())["traceEvents"]
    time.sleep(1.0)
    assert _survivors(pids) == []


@pytest.mark.slow
def test_a_stop_whose_grace_is_shorter_than_a_step_still_checkpoints_and_resumes(tmp_path):
    """A default SmolLM2 step on 2 cores outlasts the 20 s grace: the launcher waits what the coordinator
    measured the step and its checkpoint need instead (here the grace is 0.01 s), and says what a second
    signal would lose."""
    out = tmp_path / "run"
    proc = _spawn(out, "--steps", "200", "--system", "static", "--launch.stop-grace-s", "0.01")
    _wait_until(lambda: _metric_rows(out) >= 2, 240, proc)
    os.kill(proc.pid, signal.SIGINT)
    rc = proc.wait(timeout=120)
    text = proc.stdout.read()
    assert rc == 130, text[-2000:]
    assert "the ranks get up to" in text and "`--resume` continues from the checkpoint of step" in text, text[-2000:]
    steps = json.loads((out / "summary.json").read_text())["steps"]
    assert (out / "ckpt" / f"step-{steps:06d}" / "COMPLETE").is_file()
    resumed = subprocess.run([sys.executable, str(ROOT / "libra.py"), *SMALL, "--bench", "search", "--system", "static",
                              "--steps", str(steps + 2), "--resume", str(out)], cwd=ROOT, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["steps"] == steps + 2
