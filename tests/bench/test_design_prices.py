"""bench/design_prices.py: every design libra may choose, priced by its ranking and simulated held fixed."""

from bench.design_prices import QUICK, candidates, family, measure
from bench.presets import get_preset
from runlog import LAG_KEY
from sim.run import cost_model_of, play_system


def test_a_held_design_runs_as_priced_without_a_planner():
    """Its layout for the whole run, its batching and its lag: a finish-order design at lag 2 trains no group more
    than its trained-lag bound late, and nothing moves it."""
    preset, bench = QUICK[0]
    cfg = get_preset(preset, bench, 0)
    designs = candidates(cfg, cost_model_of(cfg))
    held = next(d for d in designs if d.system == "libra-partial" and d.lag == 2)
    summary, rows, _, _ = play_system(cfg, "libra", design=held)
    assert {r["role_map_desc"] for r in rows} == {held.role_map.describe()}
    assert summary["design"] == held.label
    lags = {int(k[len(LAG_KEY):]) for r in rows for k in r if k.startswith(LAG_KEY)}
    assert max(lags) <= held.max_staleness and max(lags) > 0  # finish order: some groups are trained late


def test_every_family_the_ranking_offers_is_simulated_once():
    m = measure(*QUICK[0], seed=0)
    labels = [r["label"] for r in m["rows"]]
    assert len(labels) == len(set(labels))
    cfg = get_preset(*QUICK[0], 0)
    designs = candidates(cfg, cost_model_of(cfg))
    assert {family(d) for d in designs} >= {("libra", 1), ("libra-partial", 2), ("colocate", 0), ("libra-hybrid", 1)}
    assert len(m["rows"]) == len(designs)
    assert all(r["period_s"] > 0 and r["price_s"] > 0 and r["ttt_s"] > 0 for r in m["rows"])
