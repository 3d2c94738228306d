"""bench/sim_compare.py's headline ratios, on hand-made summaries: libra over the fastest tuned peer, the
soonest tuned peer's time to the target over libra's (inf where only libra gets there, nan where it does not),
and both forecast errors (per step, and of the mean step)."""

import math

from bench.sim_compare import headline, worst_mean
from sim.baselines import Tuned


def _summary(tok_s: float, ttt: float | None, **extra) -> dict:
    return {"tokens_per_s": tok_s, "time_to_target_s": ttt, **extra}


def _tuned(name: str, tok_s: float, ttt: float | None) -> Tuned:
    run = _summary(tok_s, ttt)
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


def test_headline_when_one_side_never_reaches_the_target():
    only_libra = headline({"systems": {"libra": _summary(1.0, 50.0)}}, tuned={"static": _tuned("static", 1.0, None)})
    assert only_libra["tt/best*"] == math.inf and math.isnan(only_libra["forecast_mean_err"])
    not_libra = headline({"systems": {"libra": _summary(1.0, None)}}, tuned={"static": _tuned("static", 1.0, 80.0)})
    assert math.isnan(not_libra["tt/best*"])


def test_worst_mean_is_the_lowest_preset_mean_over_seeds():
    rows = [("a", "swe", {"tt/best*": 1.2}, ""), ("a", "swe", {"tt/best*": 0.8}, ""), ("b", "math", {"tt/best*": 0.9}, "")]
    assert worst_mean(rows, "tt/best*") == 0.9
    assert math.isnan(worst_mean(rows + [("c", "swe", {"tt/best*": math.nan}, "")], "tt/best*"))
