"""simulate/compare end to end on small clusters: docs/design.md outputs, conservation across systems,
no system beats the oracle, determinism, and the sanity scenarios (zero tail, heavy tail,
training-heavy)."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from bench.presets import PRESETS, SCENARIOS, heavy_tail, length_drift, pareto_tail, training_heavy, zero_tail
from runlog import trajectory_lags
from scheduler.systems import SYSTEMS
from sim.config import SimConfig
from sim.run import compare, format_table, play_system, simulate

METRIC_FIELDS = {"step", "time_s", "step_s", "rollout_s", "train_s", "sync_s", "reconfig_s", "tokens", "trajectories",
                 "reward_mean", "staleness_max", "migrations", "role_map", "idle_frac_rollout", "idle_frac_train"}
SUMMARY_FIELDS = {"bench", "system", "mode", "steps", "tokens_per_s", "trajectories_per_s", "reward_first",
                  "reward_last", "wall_s", "dropped", "peak_rss_mb"}
SMALL = SimConfig(bench="swe", model="qwen3-4b", num_devices=8, steps=4, prompts_per_step=8, samples_per_prompt=4)


@pytest.fixture(scope="module")
def small_compare(tmp_path_factory):
    out = tmp_path_factory.mktemp("cmp")
    return compare(SMALL, None, out), out


def test_compare_writes_design_outputs_for_every_system(small_compare):
    result, out = small_compare
    on_disk = json.loads((out / "compare.json").read_text())
    assert on_disk["bench"] == "swe" and on_disk["mode"] == "sim"
    assert set(on_disk["systems"]) == set(SYSTEMS) | {"oracle"}
    assert "MODEL" in on_disk["note"]
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG"
    for name, summary in on_disk["systems"].items():
        assert SUMMARY_FIELDS <= set(summary) and summary["mode"] == "sim" and summary["system"] == name
        rows = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2, 3, 4]  # 1-based, as in real runs
        assert all(METRIC_FIELDS <= set(r) for r in rows)
        runs_as = summary.get("design", name).split()[0]  # libra runs the design its planner chose
        if not SYSTEMS.get(runs_as, SYSTEMS["libra"]).batch_by_finish:  # the continuous peers bound it at admission
            assert all(r["staleness_max"] <= SMALL.max_staleness for r in rows)
        for r in rows:  # every trained trajectory's own lag, which the reward model prices
            lags = trajectory_lags(r)
            assert len(lags) == r["trajectories"] and max(lags, default=0) == r["staleness_max"]


def test_tokens_and_trajectories_are_conserved_across_systems(small_compare):
    systems = small_compare[0]["systems"]
    assert len({s["tokens"] for s in systems.values()}) == 1
    assert {s["trajectories"] for s in systems.values()} == {4 * 8 * 4}


def test_no_system_beats_the_oracle_and_the_oracle_never_migrates(small_compare):
    systems = small_compare[0]["systems"]
    best = systems["oracle"]["tokens_per_s"]
    # the oracle bounds schedules of step batches; finish-order systems train other batches (a long
    # group leaves its step), so the clairvoyant step schedule is no bound for them
    assert all(s["tokens_per_s"] <= best * (1 + 1e-9) for n, s in systems.items()
               if not SYSTEMS.get(s.get("design", n).split()[0], SYSTEMS["libra"]).batch_by_finish)
    # the clairvoyant router never migrates; only libra's own schedule, when it is the best known, does
    assert systems["oracle"]["migrations"] == 0 or systems["oracle"]["oracle_schedule_from"] == "libra (own router)"
    assert systems["oracle"]["vs_oracle"] == 1.0


def test_table_has_a_row_per_system_and_the_model_footer(small_compare):
    text = format_table(small_compare[0])
    lines = text.splitlines()
    assert len(lines) == 3 + len(set(SYSTEMS) | {"oracle"}) + 1
    assert lines[-1].startswith("note: reward is a MODEL in simulation")
    assert any(line.startswith("oracle ") for line in lines)


def test_simulate_is_deterministic_for_a_seed(tmp_path):
    a = simulate(SMALL, "libra", tmp_path / "a")
    b = simulate(SMALL, "libra", None)
    for volatile in ("sim_wall_s", "peak_rss_mb"):
        a.pop(volatile), b.pop(volatile)
    assert a == b
    assert (tmp_path / "a" / "trajectories.jsonl").exists()
    assert json.loads((tmp_path / "a" / "config.json").read_text())["mode"] == "sim"


SPLIT = "libra-no-design"  # libra held to its split design: the C-MLFQ and planner mechanisms these tests are about


def _ratio(cfg):
    s = compare(cfg, [SPLIT, "static"], None)["systems"]
    return s[SPLIT]["tokens_per_s"] / s["static"]["tokens_per_s"]


def test_tail_is_what_libra_exploits():
    flat = _ratio(zero_tail("swe").replace(steps=5))
    heavy = _ratio(heavy_tail("swe").replace(steps=5))
    power_law = _ratio(pareto_tail("swe").replace(steps=5))
    assert flat < 1.1  # no advantage beyond noise without a tail
    assert heavy > flat + 0.2 and power_law > flat + 0.2


def _trainers_per_step(cfg) -> list[int]:
    _, rows, _, _ = play_system(cfg, SPLIT)
    return [r["role_map"]["trainer"] for r in rows]


def test_length_drift_moves_devices_to_training_then_back_to_rollout():
    # four trainer passes make the first steps training-bound; then trajectories grow 4x
    trainers = _trainers_per_step(length_drift("swe"))
    peak = trainers.index(max(trainers))
    assert trainers[0] < trainers[peak] and trainers[-1] < trainers[peak], trainers


@pytest.mark.parametrize("name", SCENARIOS)
def test_no_system_beats_the_oracle_on_the_scenarios(name):
    cfg = PRESETS[name]()
    cfg = cfg.replace(steps=min(cfg.steps, 6))
    systems = compare(cfg, ["libra", "static", "libra-no-cmlfq", "libra-homogeneous", "oracle"], None)["systems"]
    best = systems["oracle"]["tokens_per_s"]
    assert all(s["tokens_per_s"] <= best * (1 + 1e-9) for n, s in systems.items()), \
        {n: round(s["tokens_per_s"]) for n, s in systems.items()}


def test_training_heavy_workload_moves_devices_to_training():
    s = simulate(training_heavy("math").replace(steps=5), SPLIT)
    first, last = s["role_map_first"], s["role_map_last"]
    trainers = lambda desc: int(desc.split("train=")[1].split()[0])  # noqa: E731
    assert trainers(last) > trainers(first)


def test_idle_instances_help_libra_train_and_every_trajectory_still_trains_once():
    # SmolLM2 (TP1 only) on 8 H100s: libra's split leaves TP1 instances idle when a batch is handed out
    cfg = SimConfig(bench="swe", hardware="h100", model="smollm2-135m", num_devices=8, steps=4, prompts_per_step=4,
                    samples_per_prompt=4)
    runs = {name: play_system(cfg, name, record=True) for name in ("libra", "libra-no-elastic")}
    for name, (summary, rows, admitted, _) in runs.items():
        assert summary["trajectories"] == 4 * 16 and not any(summary["dropped"].values()), name
        assert sorted(r.spec.request_id for r in admitted) == sorted({r.spec.request_id for r in admitted})
        assert all(r.finished_at >= 0 and r.decode_done == r.spec.decode_tokens for r in admitted), name
    helped = [r["train/elastic_helpers"] for r in runs["libra"][1]]
    assert max(helped) > 0, helped
    assert not any(r.get("train/elastic_helpers") for r in runs["libra-no-elastic"][1])
    # the same design and trajectories; the helpers only shorten the updates they join
    assert runs["libra"][0]["design"] == runs["libra-no-elastic"][0]["design"]
    for with_help, alone in zip(runs["libra"][1], runs["libra-no-elastic"][1]):
        if with_help["train/elastic_helpers"]:
            assert with_help["train_s"] < alone["train_s"]


def test_sim_imports_no_torch():
    code = "import sys, sim.run, sim.trace, sim.cluster; print(sorted(m for m in ('torch', 'transformers', 'multiprocessing', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _libra_cfg(**run):
    base = dict(bench="swe", system="static", seed=0, compare=False)
    base.update(run)
    return SimpleNamespace(run=SimpleNamespace(**base))


def test_libra_sim_entry_writes_a_run_dir(tmp_path, capsys):
    from sim.run import run_from_libra_config

    assert run_from_libra_config(_libra_cfg(), tmp_path) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["system"] == "static" and summary["mode"] == "sim" and summary["steps"] == 10
    assert "static (sim):" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"--sim has no workload profile for bench 'toy'; use one of \['math', 'search', 'swe'\]"):
        run_from_libra_config(_libra_cfg(bench="toy"), tmp_path)


def test_table_accepts_real_run_summaries_without_sim_columns():
    from runlog import add_ratios

    systems = {"libra": {"tokens_per_s": 30.0, "trajectories_per_s": 0.5},
               "colocate": {"tokens_per_s": 10.0, "trajectories_per_s": 0.2}}
    add_ratios(systems)
    lines = format_table({"bench": "swe", "mode": "real", "systems": systems}).splitlines()
    assert lines[3].split()[:4] == ["libra", "30", "0.500", "3.00"]
    assert len(lines) == 5
