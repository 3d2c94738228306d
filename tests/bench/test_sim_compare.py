"""bench/sim_compare.py's headline ratios, on hand-made summaries: libra over the fastest tuned peer, the
soonest tuned peer's time to the target over libra's (inf where only libra gets there, nan where it does not),
and both forecast errors (per step, and of the mean step); libra at the trained lag of the peer first to the target;
`--peers-from` reads a stored run's peers only where it simulated the same setup."""

import dataclasses
import json
import math

import pytest

from bench.presets import get_preset
import bench.sim_compare as sim_compare
from bench.sim_compare import at_trained_lag, headline, stored_peers, tuned_record, worst_mean
from sim.baselines import Tuned


def _summary(tok_s: float, ttt: float | None, **extra) -> dict:
    return {"tokens_per_s": tok_s, "time_to_target_s": ttt, **extra}


def _tuned(name: str, tok_s: float, ttt: float | None, **extra) -> Tuned:
    run = _summary(tok_s, ttt, **extra)
    return Tuned(name, run, run, "best", [], run, "best")


def test_headline_ratios_against_the_tuned_peers():
    libra = _summary(200.0, 100.0, planner_forecast_error=0.3, planner_predicted_step_s=12.0, planner_measured_step_s=10.0)
    result = {"systems": {"libra": libra, "colocate": _summary(100.0, 150.0)}}
    tuned = {"colocate": _tuned("colocate", 160.0, 120.0), "partial-rollout": _tuned("partial-rollout", 250.0, 90.0)}
    h = headline(result, tuned=tuned)
    assert h["libra/colocate"] == 2.0 and h["libra/colocate*"] == 200.0 / 160.0
    assert h["libra/best*"] == 200.0 / 250.0
    assert h["tt/colocate*"] == 1.2 and h["tt/best*"] == 0.9  # partial-rollout gets there first
    # an alternating forecast can be off at every step and right about the mean
    assert h["forecast_err"] == 0.3 and math.isclose(h["forecast_mean_err"], 0.2)


def test_libra_is_compared_at_the_trained_lag_of_the_peer_first_to_the_target(monkeypatch):
    cfg = get_preset("default", "search")
    cfg = cfg.replace(planner=dataclasses.replace(cfg.planner, max_lag=4))
    runs = []

    def fake_play(run_cfg, system):  # libra at another trained-lag bound
        runs.append((system, run_cfg.planner.max_lag))
        return _summary(1.0, 80.0), [], [], []
    monkeypatch.setattr(sim_compare, "play_system", fake_play)
    within = {"colocate": _tuned("colocate", 1.0, 120.0, staleness_max=0), "static": _tuned("static", 1.0, 95.0, staleness_max=1)}
    assert at_trained_lag(cfg, 100.0, within) == {"tt@lag/best*": 0.95} and runs == []  # within libra's own bound
    past = {**within, "partial-rollout": _tuned("partial-rollout", 1.0, 90.0, staleness_max=9)}
    assert at_trained_lag(cfg, 100.0, past) == {"tt@lag/best*": 90.0 / 80.0} and runs == [("libra", 9)]
    assert at_trained_lag(cfg, 100.0, {"static": _tuned("static", 1.0, 95.0)}) == {}  # a stored run without the record


def test_headline_when_one_side_never_reaches_the_target():
    only_libra = headline({"systems": {"libra": _summary(1.0, 50.0)}}, tuned={"static": _tuned("static", 1.0, None)})
    assert only_libra["tt/best*"] == math.inf and math.isnan(only_libra["forecast_mean_err"])
    not_libra = headline({"systems": {"libra": _summary(1.0, None)}}, tuned={"static": _tuned("static", 1.0, 80.0)})
    assert math.isnan(not_libra["tt/best*"])


def test_worst_mean_is_the_lowest_preset_mean_over_seeds():
    rows = [("a", "swe", {"tt/best*": 1.2}, ""), ("a", "swe", {"tt/best*": 0.8}, ""), ("b", "math", {"tt/best*": 0.9}, "")]
    assert worst_mean(rows, "tt/best*") == 0.9
    assert math.isnan(worst_mean(rows + [("c", "swe", {"tt/best*": math.nan}, "")], "tt/best*"))


def test_stored_peers_are_read_back_only_for_the_same_setup(tmp_path):
    cfg = get_preset("heavy_tail", "swe", 0)
    path = tmp_path / "heavy_tail-swe-seed0" / "compare.json"
    with pytest.raises(SystemExit, match="is missing; run `python -m bench.sim_compare` with --tune"):
        stored_peers(path, cfg)
    tuned = {"colocate": _tuned("colocate", 160.0, 120.0), "libra-hybrid": _tuned("libra-hybrid", 170.0, 110.0)}
    systems = {"libra": _summary(200.0, 100.0), "libra-no-cmlfq": _summary(180.0, 110.0), "colocate": _summary(100.0, 150.0)}
    path.parent.mkdir()
    # libra's own planner settings may differ from the stored run's: they are what a rerun changes
    other_planner = {**cfg.to_dict(), "planner": {"max_lag": 4}}
    path.write_text(json.dumps({"config": other_planner, "systems": systems, "tuned": tuned_record(tuned)}))
    peers, back = stored_peers(path, cfg)
    assert peers == {"colocate": systems["colocate"]}  # libra's own systems run again
    assert list(back) == ["colocate"] and back["colocate"].best == tuned["colocate"].best
    assert back["colocate"].to_target == tuned["colocate"].to_target and back["colocate"].best_label == "best"
    path.write_text(json.dumps({"config": get_preset("heavy_tail", "swe", 1).to_dict(), "systems": systems,
                                "tuned": tuned_record(tuned)}))
    with pytest.raises(SystemExit, match=r"simulated another setup \(differs in \['seed'\]\)"):
        stored_peers(path, cfg)
