"""loggers.py: slash-path keys, logger-name validation with the fix, TensorBoard event files,
wandb offline runs (skipped with the reason when wandb is not installed), and a failing logger
that is dropped instead of stopping the run."""

import importlib.util
import logging

import pytest

import config
from logger_helpers import read_scalars
from loggers import SLASH_KEYS, MetricLoggers, check_loggers, slash_metrics
from runlog import METRIC_FIELDS

ROW = {"step": 2, "time_s": 20.0, "step_s": 10.0, "rollout_s": 7.0, "train_s": 2.0, "sync_s": 0.5, "reconfig_s": 0.0,
       "tokens": 1000, "trajectories": 8, "reward_mean": 0.25, "staleness_max": 1, "migrations": 3,
       "role_map": {"trainer": 1}, "role_map_desc": "T[0] | short:[1]", "idle_frac_rollout": 0.3,
       "idle_frac_train": 0.8, "policy_version": 2, "train/loss": 0.5, "train/grad_norm": 1.25}


def test_every_numeric_step_field_gets_one_slash_key_and_extras_keep_theirs():
    m = slash_metrics(ROW)
    numeric = [k for k in METRIC_FIELDS if isinstance(ROW[k], (int, float)) and k != "step"]
    assert all(k in SLASH_KEYS for k in numeric)
    assert all("/" in k for k in m) and len(set(SLASH_KEYS.values())) == len(SLASH_KEYS)
    assert m["timing/step_s"] == 10.0 and m["rollout/reward_mean"] == 0.25 and m["train/loss"] == 0.5
    assert m["rollout/tokens_per_s"] == 100.0 and "role_map" not in str(m)


def test_logger_names_are_checked_and_jsonl_is_always_on():
    assert check_loggers(("console",)) == ("jsonl", "console")
    with pytest.raises(ValueError, match=r"unknown logger\(s\) \['mlflow'\]; choose from console,jsonl,tensorboard,wandb"):
        check_loggers(("console", "mlflow"))
    assert config.parse_args(["--run.loggers", "console"]).run.loggers == ("jsonl", "console")


def test_a_missing_logger_package_is_refused_with_the_pip_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("wandb",) else real(name, *a))
    with pytest.raises(ValueError, match=r"--run.loggers wandb needs the wandb package: pip install wandb"):
        config.parse_args(["--loggers", "console,wandb"])





@pytest.mark.skipif(not importlib.util.find_spec("tensorboardX"), reason="tensorboardX not installed (requirements-dev.txt)")
def test_tensorboard_writes_an_event_file_with_the_slash_keys(tmp_path):
    loggers = MetricLoggers(("jsonl", "tensorboard"), tmp_path, {"run": {"bench": "math"}})
    loggers.log(ROW)
    loggers.log({**ROW, "step": 3, "reward_mean": 0.5})
    loggers.close()
    scalars = read_scalars(tmp_path / "tensorboard")
    assert {"timing/step_s", "rollout/reward_mean", "train/loss"} <= set(scalars)
    assert scalars["rollout/reward_mean"] == [(2, 0.25), (3, 0.5)]


@pytest.mark.skipif(not importlib.util.find_spec("wandb"), reason="wandb not installed (pip install wandb to test it)")
def test_wandb_offline_writes_its_run_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    loggers = MetricLoggers(("jsonl", "wandb"), tmp_path / "run-x", {"run": {"bench": "math"}})
    loggers.log(ROW)
    loggers.close()
    runs = list((tmp_path / "run-x" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_a_failing_logger_is_reported_once_and_dropped(tmp_path, caplog):
    class Broken:
        def log(self, metrics, step):
            raise OSError("disk full")

        def close(self):
            pass

    loggers = MetricLoggers(("jsonl",), tmp_path, {})
    loggers.backends["tensorboard"] = Broken()
    with caplog.at_level(logging.ERROR):
        loggers.log(ROW)
        loggers.log(ROW)
    assert loggers.backends == {} and len([r for r in caplog.records if "disk full" in r.getMessage()]) == 1
