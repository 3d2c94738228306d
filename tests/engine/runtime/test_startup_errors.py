"""Every start-up failure of `python libra.py ...` is one error line naming the cause and the fix.

Each case runs the real command in a subprocess and checks: the exit code (2 for a user/config
mistake, 1 for the environment), exactly one `libra: ...` error line that names the cause and the
fix, no traceback, and no run dir left behind. The checks that make this so run in the launcher
before any rank starts (engine/runtime/preflight.py): a failure inside a rank would come back with its
traceback. Cases: a venv reached through a symlink (it must just work, also as an unprivileged
user), an interpreter the sandbox uid cannot read, a module the sandbox cannot see, a broken
`--model` dir (missing, no config.json, corrupt or rejected config, no or truncated weights, a
missing shard, no tokenizer), and bad `--out`, `--resume`, `--env`, `--data`, `--env.root-dir`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cli_helpers import ERROR, RUN, expose_interpreter
from cli_helpers import fails as _fails
from cli_helpers import libra as _libra
from envs.sandbox.sandbox import Sandbox, SandboxConfig

ROOT = Path(__file__).resolve().parents[3]
NOBODY = 65534


def _namespaces() -> str | None:
    try:
        Sandbox(SandboxConfig())
        return None
    except RuntimeError as e:
        return str(e)


NO_NS = _namespaces()
needs_ns = pytest.mark.skipif(NO_NS is not None, reason=f"user namespaces unavailable: {NO_NS}")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: only then does the sandbox run as another uid")


def _venv(parent: Path, name: str = "vx") -> Path:
    """A venv of our base interpreter (made in ~0.1 s, no pip) whose site-packages point at ours through
    a .pth file: the host side of libra imports as usual, the sandbox sees only the venv and the base."""
    venv = parent / name
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    ours = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    (venv / "lib" / ver / "site-packages" / "ours.pth").write_text("\n".join(ours) + "\n")
    return venv


def _python_in(prefix: str) -> str:
    """Our interpreter's path with its prefix replaced by `prefix` (e.g. a symlink to the prefix)."""
    rel = os.path.relpath(os.path.abspath(sys.executable), os.path.abspath(sys.prefix))
    return os.path.join(prefix, rel)


# ---- the sandbox and the interpreter ---------------------------------------------------------------------

_PROBE = """
import sys
sys.path.insert(0, {root!r})
from envs.sandbox.sandbox import Sandbox, SandboxConfig
sb = Sandbox(SandboxConfig(root_dir={sandbox_root!r}))
sb.check_interpreter(["-c", "import pytest"], "pytest")
with sb.workdir() as w:
    r = sb.run([sys.executable, "-c", "import sys, pytest; print(sys.executable, sys.prefix)"], cwd=w)
print(r.returncode, r.stdout.strip(), r.stderr.strip()[-500:])
"""


def _symlinked_pythons(base: Path) -> dict[str, str]:
    """Our interpreter as reached through a symlink to its prefix, and through a symlinked dir above it."""
    prefix = os.path.realpath(sys.prefix)
    (base / "v").symlink_to(prefix)
    (base / "up").symlink_to(os.path.dirname(prefix))
    return {"prefix": _python_in(str(base / "v")),
            "dir_above": _python_in(str(base / "up" / os.path.basename(prefix)))}


@needs_ns
@pytest.mark.parametrize("how", ["prefix", "dir_above"])
def test_symlinked_venv_runs_in_the_sandbox(tmp_path, how):
    python = _symlinked_pythons(tmp_path)[how]
    script = _PROBE.format(root=str(ROOT), sandbox_root="")
    proc = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[:2] == ["0", python], proc.stdout


@needs_ns
@as_root
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="util-linux setpriv is needed to drop to uid 65534")
def test_symlinked_venv_runs_in_the_sandbox_as_an_unprivileged_user():
    base = Path(tempfile.mkdtemp(prefix="libra-startup-"))  # not tmp_path: uid 65534 cannot enter it
    try:
        base.chmod(0o755)
        (base / "sb").mkdir(mode=0o777)
        (base / "sb").chmod(0o777)
        python = _symlinked_pythons(base)["prefix"]
        script = _PROBE.format(root=str(ROOT), sandbox_root=str(base / "sb"))
        proc = subprocess.run(expose_interpreter([python, "-c", script], uid=NOBODY), capture_output=True, text=True,
                              timeout=120, cwd=base)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.split()[:2] == ["0", python], proc.stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)


@needs_ns
def test_symlinked_venv_passes_the_start_up_checks(tmp_path):
    # the launcher builds the swe env (its sandbox runs `python -c "import pytest"`) before the model
    # check: a run that gets to the model's error has passed the sandbox's
    python = _symlinked_pythons(tmp_path)["prefix"]
    out = tmp_path / "run"
    line = _fails(2, *RUN, "--bench", "swe", "--model", str(tmp_path / "no-model"), "--out", str(out), python=python)
    assert line.startswith(f"--model '{tmp_path / 'no-model'}' does not exist"), line


@needs_ns
@as_root
def test_interpreter_the_sandbox_uid_cannot_read(tmp_path):
    venv = _venv(tmp_path)
    venv.chmod(0o700)
    out = tmp_path / "run"
    line = _fails(1, *RUN, "--bench", "math", "--model", "tiny", "--out", str(out), python=str(venv / "bin" / "python"))
    assert f"cannot run {venv}/bin/python: uid {NOBODY} cannot read {venv} (mode 0700, owner uid 0)" in line, line
    assert f"fix: `chmod o+rx {venv}`" in line and "namespaces do not work" not in line, line


@as_root
def test_interpreter_the_sandbox_uid_cannot_read_in_rlimits_mode(tmp_path):
    venv = _venv(tmp_path)
    venv.chmod(0o700)
    line = _fails(1, *RUN, "--bench", "math", "--model", "tiny", "--env.isolation", "rlimits", "--out",
                  str(tmp_path / "run"), python=str(venv / "bin" / "python"))
    assert f"sandbox (rlimits, uid {NOBODY}) cannot run {venv}/bin/python: uid {NOBODY} cannot " in line, line
    assert "fix: `chmod o+" in line and "or use --env.isolation auto" in line, line


@needs_ns
def test_module_the_sandbox_does_not_bind(tmp_path):
    # pytest reaches this venv through a .pth file naming a dir outside it, which the sandbox does not bind
    venv = _venv(tmp_path)
    line = _fails(1, *RUN, "--bench", "swe", "--model", "tiny", "--out", str(tmp_path / "run"),
                  python=str(venv / "bin" / "python"))
    assert f"cannot run {venv}/bin/python with pytest: pytest comes from " in line, line
    assert f"install pytest into this interpreter (`{venv}/bin/python -m pip install pytest`)" in line, line


def test_module_the_interpreter_lacks():
    sb = Sandbox(SandboxConfig(isolation="auto" if NO_NS is None else "rlimits"))
    with pytest.raises(RuntimeError) as err:
        sb.check_interpreter(["-c", "import libra_no_such_module"], "a missing module")
    assert "this interpreter has no module 'libra_no_such_module'" in str(err.value)
    assert "-m pip install libra_no_such_module" in str(err.value) and "\n" not in str(err.value)


def test_sandbox_root_that_cannot_be_created(tmp_path):
    line = _fails(1, *RUN, "--bench", "math", "--model", "tiny", "--env.root-dir", "/proc/libra-test",
                  "--out", str(tmp_path / "run"))
    assert "cannot create the work-dir root /proc/libra-test/" in line and "pass --env.root-dir" in line, line


# ---- the model directory ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    from engine.models import build_tiny

    path = tmp_path_factory.mktemp("tiny") / "ckpt"
    model, tokenizer = build_tiny(0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _broken(tiny_dir: Path, tmp_path: Path, case: str) -> Path:
    """A copy of the tiny checkpoint broken in one way."""
    d = tmp_path / case
    if case == "missing":
        return d
    shutil.copytree(tiny_dir, d)
    weights = d / "model.safetensors"
    if case == "no_config":
        (d / "config.json").unlink()
    elif case == "config_not_json":
        (d / "config.json").write_text('{"model_type": "qwen2", ')
    elif case == "config_bad_field":
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, "hidden_size": "wide"}))
    elif case == "no_weights":
        weights.unlink()
    elif case == "truncated_weights":
        os.truncate(weights, weights.stat().st_size - 100)
    elif case == "missing_shard":
        weights.rename(d / "model-00001-of-00002.safetensors")
        index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    elif case == "no_tokenizer":
        for f in d.glob("tokenizer*"):
            f.unlink()
    return d


MODEL_CASES = {
    "missing": ("does not exist", "pass the local path of a Hugging Face checkpoint directory"),
    "no_config": ("is a directory but not a Hugging Face checkpoint (no config.json in it)", "save_pretrained"),
    "config_not_json": ("config.json is not valid JSON", "save the checkpoint again with save_pretrained"),
    "config_bad_field": ("transformers cannot read", "hidden_size"),
    "no_weights": ("has a config.json but no weights", "copy the checkpoint's weight files there"),
    "truncated_weights": ("is not a readable safetensors file", "copy it again"),
    "missing_shard": ("names 2 shards but 1 are missing", "model-00002-of-00002.safetensors"),
    "no_tokenizer": ("has no tokenizer", "tokenizer.save_pretrained"),
}


@pytest.mark.parametrize("case", MODEL_CASES)
def test_broken_model_dir(tiny_dir, tmp_path, case):
    model = _broken(tiny_dir, tmp_path, case)
    out = tmp_path / "run"
    line = _fails(2, *RUN, "--bench", "toy", "--model", str(model), "--out", str(out), out=out)
    cause, fix = MODEL_CASES[case]
    assert line.startswith(f"--model '{model}'"), line
    assert cause in line and fix in line, line


# ---- run dir, plug-ins, data -----------------------------------------------------------------------------


def test_out_dir_that_cannot_be_created():
    line = _fails(2, *RUN, "--bench", "toy", "--model", "tiny", "--out", "/proc/libra-test/run")
    assert "--out '/proc/libra-test/run' cannot be created" in line and "pass a directory you can write to" in line


def test_resume_of_a_dir_without_a_run(tmp_path):
    line = _fails(1, "--resume", str(tmp_path))
    assert f"--resume {tmp_path}: no config.json there; pass the directory of a previous run" in line


def test_resume_of_a_run_without_checkpoints(tmp_path):
    from config import parse_args

    cfg = parse_args([*RUN, "--bench", "toy", "--model", "tiny", "--out", str(tmp_path)])
    cfg.write(tmp_path / "config.json")
    line = _fails(1, "--resume", str(tmp_path))
    assert f"--resume {tmp_path}: no complete checkpoint under {tmp_path}/ckpt/" in line and "run it again with --out" in line


def test_env_plugin_that_does_not_import(tmp_path):
    line = _fails(2, *RUN, "--bench", "toy", "--model", "tiny", "--env", "libra_no_such_module:Env",
                  "--out", str(tmp_path / "run"), out=tmp_path / "run")
    assert "--env 'libra_no_such_module:Env': cannot import" in line and "PYTHONPATH" in line


def test_data_file_that_does_not_exist(tmp_path):
    data = tmp_path / "missing.jsonl"
    line = _fails(2, *RUN, "--bench", "math", "--model", "tiny", "--data", str(data), "--out", str(tmp_path / "run"),
                  out=tmp_path / "run")
    assert f"{data} does not exist" in line and "pass the path of a .parquet or .jsonl file" in line


def test_tp_degrees_the_model_cannot_split(tmp_path):
    """--planner.allowed-tp with no degree the model splits at (tiny: 4 heads, 2 kv heads): one line, no run dir
    (the coordinator used to fail inside its rank, after the launcher had fallen back to TP1)."""
    line = _fails(2, *RUN, "--bench", "toy", "--model", "tiny", "--planner.allowed-tp", "8", "--out", str(tmp_path / "run"),
                  out=tmp_path / "run")
    assert "--planner.allowed-tp 8: the model 'tiny' splits at none of these degrees" in line and "kv heads (2)" in line
