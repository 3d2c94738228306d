"""Workload profiles: determinism, zero tail, the documented tail figures, truncation, drift, config errors."""

import json
import math
import re

import pytest

from sim.workload import PROFILES, SyntheticWorkload, WorkloadProfile, get_profile, tail_stats


def _batch(name="swe", seed=0, step=0, **overrides):
    wl = SyntheticWorkload(get_profile(name, **overrides), seed=seed, num_steps=10)
    return wl.batch(step, 64, 8)


def test_specs_are_a_pure_function_of_seed_and_step():
    assert _batch(seed=3, step=2) == _batch(seed=3, step=2)
    assert _batch(seed=3, step=2) != _batch(seed=4, step=2)
    assert _batch(seed=3, step=2) != _batch(seed=3, step=3)


def test_zero_tail_gives_identical_trajectories():
    specs = _batch(tail_sigma=0.0, turn_jitter=0.0, tool_latency_sigma=0.0, drift=0.0)
    shapes = {(s.turn_tokens, s.tool_latency_s) for s in specs}
    assert len(shapes) == 1
    assert specs[0].turn_tokens == (256,) * 8


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_default_tails_match_the_documented_figures(name):
    stats = tail_stats(_batch(name))
    assert 5.0 <= stats["p99_over_p50"] <= 20.0
    assert 0.25 <= stats["top10_decode_share"] <= 0.6


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_trajectories_fit_the_context_window_and_tools_line_up(name):
    profile = get_profile(name)
    for s in _batch(name):
        assert s.total_tokens <= profile.max_context_tokens
        assert len(s.tool_outcomes) == len(s.tool_output_tokens) == len(s.tool_latency_s) == len(s.turn_tokens) - 1
        assert all(o.tool in profile.tools for o in s.tool_outcomes)


def test_pareto_tail_is_heavier_at_the_top_and_keeps_the_median():
    from sim.workload import difficulty_of

    pareto = get_profile("swe", tail_shape="pareto", tail_alpha=1.2)
    assert difficulty_of(pareto, 0.0) == pytest.approx(1.0)  # median 1, as the lognormal's
    assert difficulty_of(pareto, 2.326) == pytest.approx(50 ** (1 / 1.2), rel=1e-3)  # p99/median = 50^(1/alpha)
    assert difficulty_of(pareto, 2.326) > difficulty_of(get_profile("swe"), 2.326)
    lognormal, heavy = tail_stats(_batch("swe", drift=0.0)), tail_stats(_batch("swe", drift=0.0, tail_shape="pareto",
                                                                              tail_alpha=1.2))
    assert heavy["top10_decode_share"] > lognormal["top10_decode_share"]


def test_positive_drift_makes_later_steps_longer():
    first = sum(s.decode_tokens for s in _batch(step=0))
    last = sum(s.decode_tokens for s in _batch(step=10))
    assert last > 1.15 * first


def test_failures_signal_longer_trajectories():
    specs = _batch("swe")
    failed = [s for s in specs if s.tool_outcomes and s.tool_outcomes[0].status != "success"]
    ok = [s for s in specs if s.tool_outcomes and s.tool_outcomes[0].status == "success"]
    mean = lambda xs: sum(x.total_tokens for x in xs) / len(xs)  # noqa: E731
    assert mean(failed) > mean(ok)


def test_prompts_recur_across_steps():
    wl = SyntheticWorkload(get_profile("swe"), seed=0, num_steps=10, num_dataset_prompts=32)
    assert {s.prompt_id for s in wl.batch(0, 16, 2)} == {s.prompt_id for s in wl.batch(2, 16, 2)}


@pytest.mark.parametrize("overrides,message", [
    ({"prompt_tokens": 0, "max_context_tokens": 10}, "prompt_tokens=0 must be >= 1"),
    ({"max_context_tokens": 100, "prompt_tokens": 100}, "max_context_tokens=100 must exceed prompt_tokens=100"),
    ({"base_turns": 0.5}, "base_turns=0.5, base_turn_tokens=10 must both be >= 1"),
    ({"tail_sigma": -1.0}, "tail_sigma=-1.0, turn_jitter=0.3, tool_latency_sigma=0.8 must be >= 0"),
    ({"turn_exponent": 1.5}, "turn_exponent=1.5, prompt_share=0.5 must lie in [0, 1]"),
    ({"drift": -1.0}, "drift=-1.0 must be > -1"),
    ({"tools": ()}, "tools is empty"),
    ({"tail_shape": "zipf"}, "tail_shape='zipf', tail_alpha=1.5; use tail_shape 'lognormal' or 'pareto'"),
])
def test_profile_errors_name_the_value_and_fix(overrides, message):
    base = dict(name="x", prompt_tokens=10, base_turns=2, max_turns=4, base_turn_tokens=10, max_turn_tokens=100)
    base.update(overrides)
    with pytest.raises(ValueError, match=re.escape(message)):
        WorkloadProfile(**base)


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown workload 'nope'; pick one of \['math', 'search', 'swe'\]"):
        get_profile("nope")


def test_env_profile_loads_from_json(tmp_path):
    path = tmp_path / "toy.json"
    path.write_text('{"name": "toy", "prompt_tokens": 50, "base_turns": 2, "max_turns": 3, "base_turn_tokens": 20, '
                    '"max_turn_tokens": 64, "max_context_tokens": 512, "tools": ["calc"], "output_tokens": [8, 16, 32]}')
    profile = get_profile(str(path), drift=0.5)
    assert profile.tools == ("calc",) and profile.output_tokens == (8, 16, 32) and profile.drift == 0.5
    path.write_text('{"name": "toy", "colour": 1}')
    with pytest.raises(ValueError, match=r"unknown fields \['colour'\]"):
        get_profile(str(path))


def test_env_profile_summary_becomes_a_workload(tmp_path):
    q = lambda med, p99: {"median": med, "p90": med, "p99": p99, "mean": med, "n": 10}  # noqa: E731
    summary = {"bench": "search", "turns": q(3, 6), "prompt_tokens": q(300, 400), "tokens_per_turn": q(100, 500),
               "tool_output_tokens": q(200, 800), "tool_latency_s": {"search": q(0.05, 0.5)}}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(summary))
    p = get_profile(str(path))
    assert (p.name, p.prompt_tokens, p.base_turns, p.base_turn_tokens, p.tools) == ("search", 300, 3, 100, ("search",))
    assert p.output_tokens == (100, 200, 800) and p.max_turns == 9
    assert p.tail_sigma == pytest.approx(math.log(10) / 2.326)
    specs = SyntheticWorkload(p, seed=0, num_steps=1).batch(0, 4, 2)
    assert len(specs) == 8 and all(s.prompt_tokens == 300 for s in specs)
