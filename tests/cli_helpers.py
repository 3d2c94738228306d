"""What several tests share about running `python libra.py` in a subprocess and exposing the
interpreter to the sandbox's uid (start-up errors, the vLLM backend's start-up check, the attacks)."""

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from envs.sandbox import fs as sfs

ROOT = Path(__file__).resolve().parents[1]
RUN = ["--device", "cpu", "--steps", "1"]
ERROR = re.compile(r"^\d\d:\d\d:\d\d libra: (.*)$", re.M)


def libra(*args: str, python: str = sys.executable) -> tuple[int, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "LIBRA_LOG": "INFO"}
    proc = subprocess.run([python, str(ROOT / "libra.py"), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)
    return proc.returncode, proc.stdout + proc.stderr


def fails(rc_expected: int, *args: str, python: str = sys.executable, out: Path | None = None) -> str:
    """Run libra, expect it to fail with `rc_expected` and one error line; return that line."""
    rc, text = libra(*args, python=python)
    assert "Traceback" not in text, text[-3000:]
    lines = ERROR.findall(text)
    assert len(lines) == 1, text[-3000:]
    assert rc == rc_expected, (rc, lines[0])
    assert " failed: " not in text, text[-2000:]  # no rank was reached (engine/runtime/launch.py WorkerFailed)
    if out is not None:
        assert not out.exists(), f"{out} was created by a run that failed at start-up"
    return lines[0]


def expose_interpreter(argv: list[str], *, uid: int | None, stage: Path | None = None) -> list[str]:
    """argv run in a private mount namespace where /root and /home are traversable, with the
    interpreter's dirs under them bound back, optionally as `uid` (root only). The staging dir
    (`stage`, else a fresh temp dir) is removed by the script once the binds moved away (one was
    left per run, issue 30; tests/engine/runtime/test_startup_errors.py passes none)."""
    stage = stage or Path(tempfile.mkdtemp(prefix="libra-adv-stage-"))
    dirs = [d for d in sfs.interpreter_dirs() if sfs.under(d, "/root") or sfs.under(d, "/home")]
    script = ('set -e; i=0; for d in $DIRS; do mkdir -p "$STAGE/$i"; mount --bind "$d" "$STAGE/$i"; i=$((i+1)); done\n'
              'for top in /root /home; do [ -d $top ] && mount -t tmpfs -o size=1m,mode=755 none $top; done\n'
              'i=0; for d in $DIRS; do mkdir -p "$d"; mount --move "$STAGE/$i" "$d"; rmdir "$STAGE/$i"; i=$((i+1)); done\n'
              'rmdir "$STAGE"; exec "$@"')
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if uid is not None else []
    return ["env", f"DIRS={' '.join(dirs)}", f"STAGE={stage}", "unshare", "--mount", "--propagation", "private",
            "sh", "-c", script, "sh", *drop, *argv]
