"""SimConfig and the reward model: every config error message, JSON-safety, the curve's properties."""

import json
import re

import pytest

from sim.config import SimConfig
from sim.reward import RewardCurve, RewardTracker, curve_for, default_target


@pytest.mark.parametrize("field,value,message", [
    ("hardware", "tpu", "SimConfig.hardware='tpu' is unknown; pick one of"),
    ("model", "gpt", "SimConfig.model='gpt' is unknown; pick one of"),
    ("steps", 0, "SimConfig.steps=0 must be >= 1; give a positive count"),
    ("prompts_per_step", 0, "SimConfig.prompts_per_step=0 must be >= 1"),
    ("samples_per_prompt", -1, "SimConfig.samples_per_prompt=-1 must be >= 1"),
    ("max_seqs_per_instance", 0, "SimConfig.max_seqs_per_instance=0 must be >= 1"),
    ("train_epochs", 0, "SimConfig.train_epochs=0 must be >= 1"),
    ("dataset_prompts", 0, "SimConfig.dataset_prompts=0 must be >= 1"),
    ("num_devices", 1, "SimConfig.num_devices=1 must be >= 2 so that rollout and training each get a device"),
    ("max_staleness", -1, "SimConfig.max_staleness=-1 must be >= 0; 0 means on-policy"),
    ("lag_gamma", 0.0, "SimConfig.lag_gamma=0.0 must lie in (0, 1]"),
    ("lag_gamma", 1.5, "SimConfig.lag_gamma=1.5 must lie in (0, 1]"),
    ("reward_target", 1.5, "SimConfig.reward_target=1.5 must lie in (0, 1) or be None"),
])
def test_config_errors_name_field_value_and_fix(field, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SimConfig(**{field: value})


def test_to_dict_is_json_safe_and_complete():
    cfg = SimConfig(workload_overrides=(("tail_sigma", 0.0),))
    d = json.loads(json.dumps(cfg.to_dict()))
    assert d["workload_overrides"] == {"tail_sigma": 0.0}
    assert set(d) == set(SimConfig.__dataclass_fields__)
    assert cfg.trajectories_per_step == 16 * 8


@pytest.mark.parametrize("kw,message", [
    (dict(r0=0.5, r_max=0.4, tau_steps=1.0), "RewardCurve r0=0.5, r_max=0.4 need 0 <= r0 < r_max <= 1"),
    (dict(r0=0.1, r_max=0.4, tau_steps=0.0), "RewardCurve.tau_steps=0.0 must be > 0 steps"),
])
def test_reward_curve_errors(kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        RewardCurve(**kw)


def test_reward_rises_and_staleness_slows_it():
    curve = RewardCurve(r0=0.1, r_max=0.5, tau_steps=10.0)
    assert curve.at(0) == 0.1
    assert curve.at(10) == pytest.approx(0.1 + 0.4 * (1 - 0.36787944117144233))
    fresh, stale = RewardTracker(curve, 0.9), RewardTracker(curve, 0.9)
    a = [fresh.step([0, 0]) for _ in range(20)]
    b = [stale.step([1, 1]) for _ in range(20)]
    assert a == sorted(a) and all(x > y for x, y in zip(a, b))
    assert stale.progress == pytest.approx(18.0)


def test_default_target_is_reached_at_sixty_percent_of_an_on_policy_run():
    curve = curve_for("swe", 10)
    target = default_target(curve, 10)
    tracker = RewardTracker(curve, 0.9)
    rewards = [tracker.step([0]) for _ in range(10)]
    assert next(i for i, r in enumerate(rewards) if r >= target) == 5


def _sim_of(*argv):
    from config import given_keys, parse_args
    from sim.config import from_libra_config

    argv = ["--sim", *argv]
    return from_libra_config(parse_args(argv), given_keys(argv))


def test_sim_flags_reach_the_simulated_run():
    from scheduler.prefix_tree import PrefixTreeConfig
    from sim.config import buckets_of, default_router, default_sim

    assert _sim_of("--bench", "math", "--seed", "3") == default_sim("math", seed=3)  # the preset: no flag, no change
    cfg = _sim_of("--bench", "swe", "--step.max-staleness", "3", "--steps", "4", "--nproc", "8", "--model", "qwen3-4b",
                  "--step.prompts-per-step", "6", "--step.samples-per-prompt", "4", "--rollout.max-batch", "48",
                  "--planner.interval-steps", "5", "--router.tree.window", "300", "--buckets.max-tokens", "1000,3000")
    assert (cfg.max_staleness, cfg.steps, cfg.num_devices, cfg.model) == (3, 4, 8, "qwen3-4b")
    assert (cfg.prompts_per_step, cfg.samples_per_prompt, cfg.max_seqs_per_instance) == (6, 4, 48)
    assert cfg.planner.interval_steps == 5 and cfg.buckets.max_tokens == (1000, 3000) == buckets_of(cfg).max_tokens
    # a router flag goes on top of the simulator's own router settings (its tree rebuilt about once a step)
    assert cfg.router.tree == PrefixTreeConfig(window=300, rebuild_every=default_router(cfg).tree.rebuild_every)
    # the preset's sections (a CPU run's planner, buckets) do not leak into the simulated cluster
    assert _sim_of("--bench", "swe", "--step.max-staleness", "2").replace(max_staleness=1) == default_sim("swe")


@pytest.mark.parametrize("argv,message", [
    (["--trainer.lr", "1e-5", "--launch.timeout-s", "5"], "--sim: --launch.timeout-s, --trainer.lr mean nothing in the simulator"),
    (["--device", "cuda"], "--sim: --device means nothing in the simulator"),
    (["--rollout.temperature", "0.5"], "--sim: --rollout.temperature means nothing"),
    (["--planner.profile", "auto"], "--sim: --planner.profile auto measures this machine"),
    (["--model", "smollm2"], "--sim: SimConfig.model='smollm2' is unknown; pick one of"),
])
def test_a_flag_without_a_simulator_meaning_is_refused_by_name(argv, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _sim_of(*argv)


def test_libra_sim_runs_with_the_flags_given(tmp_path):
    import libra

    out = tmp_path / "sim"
    assert libra.main(["--sim", "--bench", "math", "--steps", "2", "--step.max-staleness", "2", "--out", str(out)]) == 0
    sim = json.loads((out / "config.json").read_text())["sim"]
    assert (sim["steps"], sim["max_staleness"]) == (2, 2)
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    assert libra.main(["--sim", "--bench", "math", "--trainer.lr", "1e-5", "--out", str(tmp_path / "no")]) == 2
