"""Bad input ends as one line naming the value and the fix (exit 2), and no run dir is created.

Each case goes through `libra.main` as a user would; every one fails before a rank starts.
"""

import json
import logging
import os
from pathlib import Path

import pytest

import libra
from engine.runtime.preflight import check_out_dir

BASE = ["--device", "cpu", "--steps", "1", "--bench", "toy"]


def _fail(caplog, *args: str) -> str:
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="libra"):
        rc = libra.main([*BASE, *args])
    assert rc == 2, f"expected a config error (exit 2), got {rc}"
    lines = [r.getMessage() for r in caplog.records if r.name == "libra" and r.levelno >= logging.ERROR]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    return lines[0]


def _model_dir(tmp_path: Path, text: str) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(text)
    return d


def test_model_config_that_is_not_json(tmp_path, caplog):
    model = _model_dir(tmp_path, '{"model_type": "qwen2", ')
    out = tmp_path / "run"
    line = _fail(caplog, "--model", str(model), "--out", str(out))
    assert f"--model '{model}'" in line and "is not valid JSON" in line and "save_pretrained" in line
    assert not out.exists()


def test_model_config_with_unknown_architecture(tmp_path, caplog):
    model = _model_dir(tmp_path, json.dumps({"model_type": "florbnet", "architectures": ["FlorbForCausalLM"]}))
    out = tmp_path / "run"
    line = _fail(caplog, "--model", str(model), "--out", str(out))
    assert "model_type 'florbnet'" in line and "does not know" in line and "qwen2" in line
    assert not out.exists()


def test_model_config_without_causal_lm_head(tmp_path, caplog):
    model = _model_dir(tmp_path, json.dumps({"model_type": "vit"}))
    line = _fail(caplog, "--model", str(model), "--out", str(tmp_path / "run"))
    assert "model_type 'vit' has no causal-LM head" in line


def test_out_under_a_file(tmp_path, caplog):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    line = _fail(caplog, "--model", "tiny", "--out", str(blocker / "run"))
    assert f"'{blocker}' is a file" in line and "pass a path whose parents are directories" in line
    line = _fail(caplog, "--model", "tiny", "--out", str(blocker))
    assert "is a file, not a directory" in line
    assert blocker.read_text() == "x"


def test_out_in_a_place_nobody_can_write(caplog):
    # /proc refuses mkdir even for root, so this case runs everywhere
    line = _fail(caplog, "--model", "tiny", "--out", "/proc/libra-test/run")
    assert "--out '/proc/libra-test/run' cannot be created: '/proc' is not writable" in line
    assert "pass a directory you can write to" in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a 0o555 directory; the /proc case covers root")
def test_out_in_a_read_only_dir(tmp_path, caplog):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        line = _fail(caplog, "--model", "tiny", "--out", str(ro / "run"))
        assert "is not writable" in line
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


def test_writable_out_passes_and_creates_nothing(tmp_path):
    check_out_dir(tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []
