"""Fault injection on real runs, as an operator meets them: what each fault does and whether `--resume` recovers.

`python -m bench.faults [--only NAME,...]` runs the tiny model on the search bench (static system, 4
workers, a checkpoint every 3 steps) once per fault, and prints one row each: exit code, seconds from
the fault to the exit, processes of the run left alive, the newest complete checkpoint, and the
outcome of `--resume` to 8 steps (its exit code and the steps in its summary); last line
`faults_resumed: K/N`. Faults: SIGINT,
SIGTERM and SIGHUP to the launcher, SIGTERM to every process (systemd, Slurm), SIGKILL of the
coordinator, a rollout rank and a trainer rank, SIGSTOP of a rollout rank for 8 s (then SIGCONT),
SIGSTOP of a trainer past `--launch.rank-timeout-s 6`, a full disk (the run directory on a 3 MB
tmpfs: root only), and torn checkpoints (a newest one without its marker, and one whose trainer.pt
was cut short). Takes about 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--model", "tiny", "--device", "cpu", "--nproc", "4", "--bench", "search", "--system", "static",
        "--step.prompts-per-step", "2", "--step.samples-per-prompt", "2", "--rollout.max-new-tokens-per-turn", "12",
        "--rollout.max-turns", "2", "--num-tasks", "8", "--step.checkpoint-every", "3", "--launch.straggler-s", "2"]


def _start(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "libra.py"), *ARGS, "--out", str(out), *extra], cwd=ROOT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _rows(out: Path) -> int:
    path = out / "metrics.jsonl"
    try:
        return len(path.read_text().splitlines()) if path.exists() else 0
    except OSError:
        return 0


def _rank(out: Path, role: str) -> int:
    for p in sorted((out / "ranks").glob("rank*.json")):
        info = json.loads(p.read_text())
        if info[role]:
            return info["pid"]
    raise RuntimeError(f"no {role} rank in {out}/ranks")


def _coordinator(proc: subprocess.Popen, out: Path) -> int:
    """Rank 0: the child of the forkserver (the launcher's grandchild) that is not a worker."""
    workers = {json.loads(p.read_text())["pid"] for p in (out / "ranks").glob("rank*.json")}
    ranks = [g.pid for c in psutil.Process(proc.pid).children() for g in c.children() if g.pid not in workers]
    assert len(ranks) == 1, f"expected one coordinator, found {ranks}"
    return ranks[0]


def _alive(pids: list[int]) -> int:
    n = 0
    for pid in pids:
        try:
            n += psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            pass
    return n


def _latest(out: Path) -> str:
    done = sorted(p.name for p in (out / "ckpt").glob("step-*") if (p / "COMPLETE").is_file()) if (out / "ckpt").is_dir() else []
    return done[-1] if done else "-"


def _resume(out: Path) -> str:
    r = subprocess.run([sys.executable, str(ROOT / "libra.py"), *ARGS, "--steps", "8", "--resume", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    text = r.stdout + r.stderr
    if r.returncode != 0:
        last = [line for line in text.splitlines() if "libra" in line][-1:] or text.splitlines()[-1:]
        return f"rc {r.returncode}: {last[0][-110:] if last else ''}"
    summary = json.loads((out / "summary.json").read_text())
    return f"rc 0, from step {summary.get('resumed_from_step')} to {summary['steps']}"


def _signal(sig, who):
    def fault(proc, out, pids):
        if who == "launcher":
            os.kill(proc.pid, sig)
        elif who == "every process":
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        else:
            os.kill(_coordinator(proc, out) if who == "coordinator" else _rank(out, who), sig)
    return fault


def _stop_for(role: str, seconds: float | None):
    def fault(proc, out, pids):
        pid = _rank(out, role)
        os.kill(pid, signal.SIGSTOP)
        if seconds is not None:
            time.sleep(seconds)
            os.kill(pid, signal.SIGCONT)
    return fault


FAULTS = {
    "SIGINT launcher": (_signal(signal.SIGINT, "launcher"), ()),
    "SIGTERM launcher": (_signal(signal.SIGTERM, "launcher"), ()),
    "SIGHUP launcher": (_signal(signal.SIGHUP, "launcher"), ()),
    "SIGTERM every process": (_signal(signal.SIGTERM, "every process"), ()),
    "SIGKILL coordinator": (_signal(signal.SIGKILL, "coordinator"), ()),
    "SIGKILL rollout rank": (_signal(signal.SIGKILL, "rollout"), ()),
    "SIGKILL trainer rank": (_signal(signal.SIGKILL, "trainer"), ()),
    "SIGSTOP rollout 8 s": (_stop_for("rollout", 8.0), ()),
    "SIGSTOP trainer (hung)": (_stop_for("trainer", None), ("--launch.rank-timeout-s", "6")),
}


def run_fault(name: str, tmp: Path) -> dict:
    fault, extra = FAULTS[name]
    out = tmp / name.replace(" ", "-")
    steps = "12" if name.startswith("SIGSTOP rollout") else "200"
    proc = _start(out, "--steps", steps, *extra)
    deadline = time.monotonic() + 240
    while _rows(out) < 4 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    pids = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    t0 = time.monotonic()
    fault(proc, out, pids)
    rc = proc.wait(timeout=300)
    exit_s = time.monotonic() - t0
    text = proc.stdout.read()
    time.sleep(1.0)
    said = [line for line in text.splitlines() if "libra:" in line or "heartbeat" in line or "failed:" in line]
    return {"fault": name, "rc": rc, "exit_s": exit_s, "survivors": _alive(pids), "checkpoint": _latest(out),
            "said": said[-1][-120:] if said else "", "resume": _resume(out)}


def disk_full(tmp: Path) -> dict:
    """The run directory on a 3 MB tmpfs: checkpoints do not fit."""
    mnt = tmp / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True).returncode:
        return {"fault": "disk full", "rc": None, "exit_s": 0.0, "survivors": 0, "checkpoint": "-",
                "said": "skipped: mounting a tmpfs needs root", "resume": "-"}
    try:
        out = mnt / "run"
        t0 = time.monotonic()
        proc = _start(out, "--steps", "8")
        rc = proc.wait(timeout=300)
        text = proc.stdout.read()
        said = [line for line in text.splitlines() if "libra:" in line or "could not write" in line or "failed:" in line]
        return {"fault": "disk full (3 MB tmpfs)", "rc": rc, "exit_s": time.monotonic() - t0, "survivors": 0,
                "checkpoint": _latest(out), "said": said[-1][-120:] if said else "", "resume": _resume(out)}
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def torn(tmp: Path, how: str) -> dict:
    out = tmp / f"torn-{how}"
    proc = _start(out, "--steps", "6")
    rc = proc.wait(timeout=300)
    ckpt = out / "ckpt"
    if how == "no marker":  # killed mid-write: the newest directory lacks COMPLETE
        (ckpt / "step-000006" / "COMPLETE").unlink()
    else:  # the file system lost the tail of the newest trainer.pt
        path = ckpt / "step-000006" / "trainer.pt"
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return {"fault": f"torn checkpoint ({how})", "rc": rc, "exit_s": 0.0, "survivors": 0, "checkpoint": _latest(out),
            "said": "", "resume": _resume(out)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="comma-separated fault names (default: all)")
    args = p.parse_args()
    names = [n for n in args.only.split(",") if n] or [*FAULTS, "disk full", "torn no marker", "torn short file"]
    tmp = Path(tempfile.mkdtemp(prefix="libra-faults-"))
    rows = []
    try:
        for name in names:
            if name in FAULTS:
                rows.append(run_fault(name, tmp))
            elif name == "disk full":
                rows.append(disk_full(tmp))
            else:
                rows.append(torn(tmp, name.removeprefix("torn ")))
            r = rows[-1]
            print(f"{r['fault']:<26} rc {str(r['rc']):>4}  exit {r['exit_s']:5.1f} s  survivors {r['survivors']}  "
                  f"ckpt {r['checkpoint']:<12} resume: {r['resume']}\n{'':<26} said: {r['said']}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    resumed = sum(r["resume"].startswith("rc 0") for r in rows)
    print(f"faults_resumed: {resumed}/{len(rows)}")  # faults after which --resume ran the run to its end


if __name__ == "__main__":
    main()
