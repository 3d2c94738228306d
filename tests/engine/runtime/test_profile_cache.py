"""The per-machine profile cache (engine/runtime/profile_cache.py) and the cost model a real run plans on.

One real quick measurement of the tiny model (~10 s); the other cases measure with a fake that
copies it, so they check the cache logic, not the machine.
"""

import json
import logging
import shutil
import threading
import time
from pathlib import Path

import pytest

from config import parse_args
from engine.runtime import profile_cache
from engine.devices import DeviceInfo
from engine.runtime.run import cost_model_for
from scheduler.profile import HardwareProfile, ProfiledCostModel

CPU = DeviceInfo("cpu", 2)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """A real `engine.runtime.profile --quick` of tiny on this machine, cached in its own directory."""
    root = tmp_path_factory.mktemp("measured")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LIBRA_PROFILE_DIR", str(root))
        path, profile, how = profile_cache.cached_profile("tiny", "cpu")
    assert how.startswith("measured now") and profile.meta["quick"] and profile.meta["measured_s"] > 0
    # the host memory the planner keeps a CPU run within: a rank's peak RSS (a torch process: over 100 MB)
    assert sorted(profile.trainer_rss_bytes) == [1, 2] and min(profile.trainer_rss_bytes.values()) > 1e8
    assert profile.rollout_rss_bytes > 1e8 and profile.host_mem_bytes > 1e9
    assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == [path.name]  # no temp file left
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LIBRA_PROFILE_DIR", str(tmp_path / "profiles"))
    return tmp_path / "profiles"


class CopyMeasure:
    """A measurement that copies the real one and counts its calls."""

    def __init__(self, source: Path):
        self.source, self.calls = source, 0

    def __call__(self, model: str, out: Path) -> None:
        self.calls += 1
        shutil.copy(self.source, out)


def test_a_miss_measures_once_and_the_next_lookup_hits(measured, cache):
    measure = CopyMeasure(measured)
    path, profile, how = profile_cache.cached_profile("tiny", "cpu", measure=measure)
    assert measure.calls == 1 and how.startswith("measured now") and path.parent == cache
    assert profile.meta["fingerprint"] == profile_cache.fingerprint("tiny", "cpu")
    again, cached, how = profile_cache.cached_profile("tiny", "cpu", measure=measure)
    assert measure.calls == 1 and how.startswith("cached: measured") and again == path and cached == profile
    profile_cache.cached_profile("tiny", "cpu", refresh=True, measure=measure)  # --planner.profile refresh
    assert measure.calls == 2


def test_another_machine_or_torch_is_another_entry(measured, cache, monkeypatch):
    measure = CopyMeasure(measured)
    here, _, _ = profile_cache.cached_profile("tiny", "cpu", measure=measure)
    real = profile_cache.fingerprint
    monkeypatch.setattr(profile_cache, "fingerprint", lambda m, d: {**real(m, d), "torch": "0.0-other"})
    there, _, how = profile_cache.cached_profile("tiny", "cpu", measure=measure)
    assert there != here and measure.calls == 2 and how.startswith("measured now")
    assert HardwareProfile.load(there).meta["fingerprint"]["torch"] == "0.0-other"


@pytest.mark.parametrize("damage", ["truncated", "foreign"])
def test_a_corrupt_or_foreign_entry_is_measured_again_with_a_warning(measured, cache, caplog, damage):
    measure = CopyMeasure(measured)
    path, _, _ = profile_cache.cached_profile("tiny", "cpu", measure=measure)
    if damage == "truncated":  # e.g. a disk that filled up under an older, non-atomic writer
        path.write_text(path.read_text()[:100])
    else:  # a file copied from another machine under this entry's name
        data = json.loads(path.read_text())
        data["meta"]["fingerprint"]["host"] = "elsewhere"
        path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="libra"):
        again, profile, how = profile_cache.cached_profile("tiny", "cpu", measure=measure)
    assert measure.calls == 2 and again == path and how.startswith("measured now")
    assert any("is unusable" in r.message and "measuring this machine again" in r.message for r in caplog.records)
    assert HardwareProfile.load(path) == profile  # whole again


def test_two_runs_starting_together_measure_once(measured, cache, caplog):
    slow = CopyMeasure(measured)

    def measure(model, out):
        time.sleep(0.5)
        slow(model, out)

    results = []
    first = threading.Thread(target=lambda: results.append(profile_cache.cached_profile("tiny", "cpu", measure=measure)))
    with caplog.at_level(logging.INFO, logger="libra"):
        first.start()
        time.sleep(0.2)  # the first run holds the entry's lock, measuring
        second = profile_cache.cached_profile("tiny", "cpu", measure=measure)
        first.join()
    assert slow.calls == 1 and second[2].startswith("cached") and second[1] == results[0][1]
    assert any("waiting for another run that is measuring" in r.message for r in caplog.records)


def test_a_failed_measurement_raises_and_caches_nothing(cache):
    def broken(model, out):
        out.write_text("{half")
        raise RuntimeError("measuring this machine's profile failed (exit 1): boom")

    with pytest.raises(RuntimeError, match=r"profile failed \(exit 1\): boom"):
        profile_cache.cached_profile("tiny", "cpu", measure=broken)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_the_measuring_subprocess_failure_names_the_fix(tmp_path):
    fix = r"; run `python -m engine.runtime.profile --quick .*--planner.profile none to plan on the analytic tables"
    with pytest.raises(RuntimeError, match=r"profile failed \(exit 1\): ValueError: .*no-model-here.*" + fix):
        profile_cache.measure_quick(str(tmp_path / "no-model-here"), tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()


def test_a_real_run_plans_on_this_machines_cached_profile(measured, cache, caplog):
    profile_cache.cached_profile("tiny", "cpu", measure=CopyMeasure(measured))
    cfg = parse_args(["--model", "tiny"], device_kind_of=lambda d: "cpu")
    assert cfg.planner.profile == "auto"
    with caplog.at_level(logging.INFO, logger="libra"):
        cost = cost_model_for(cfg, CPU)
    assert isinstance(cost, ProfiledCostModel) and cost.profile.meta["fingerprint"]["model"] == "tiny"
    assert any("this machine's profile" in r.message and "(cached: measured" in r.message for r in caplog.records)


def test_analytic_tables_keep_a_cpu_split_a_file_is_used_as_given_and_static_measures_nothing(measured, cache):
    none = cost_model_for(parse_args(["--model", "tiny", "--planner.profile", "none"], device_kind_of=lambda d: "cpu"), CPU)
    assert not isinstance(none, ProfiledCostModel) and none.prices_split is False
    gpu = cost_model_for(parse_args(["--model", "tiny"], device_kind_of=lambda d: "cuda"), DeviceInfo("cuda", 1))
    assert not isinstance(gpu, ProfiledCostModel) and getattr(gpu, "prices_split", True)  # the tables' home ground
    given = cost_model_for(parse_args(["--model", "tiny", "--planner.profile", str(measured)], device_kind_of=lambda d: "cpu"), CPU)
    assert isinstance(given, ProfiledCostModel) and not list(cache.glob("*.json"))  # nothing measured or cached
    static = cost_model_for(parse_args(["--model", "tiny", "--system", "static"], device_kind_of=lambda d: "cpu"), CPU)
    assert not isinstance(static, ProfiledCostModel) and not cache.exists()  # no planner: nothing to measure for


def test_profile_flag_errors_name_the_values():
    with pytest.raises(ValueError, match=r"profile 'atuo' does not exist and is none of \('auto', 'refresh', 'none'\); pass auto"):
        parse_args(["--planner.profile", "atuo"], device_kind_of=lambda d: "cpu")
