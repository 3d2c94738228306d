"""runlog.py: metrics rows round-trip, the summary holds docs/design.md's fields, idle fractions lie
in [0, 1], trace.json is a trace-event list, a failing write is reported once and not raised."""

import json
import logging
import math

import pytest

from runlog import (DROP_REASONS, METRIC_FIELDS, SUMMARY_FIELDS, MetricsRow, RunWriter, add_ratios, format_table,
                    idle_fractions, plot_run, read_metrics, run_story, summarize)


def row(step: int, reward: float = 0.5, **kw) -> MetricsRow:
    base = dict(step=step, time_s=10.0 * step, step_s=10.0, rollout_s=7.0, train_s=2.0, sync_s=0.5, reconfig_s=0.0,
                tokens=1000, trajectories=8, reward_mean=reward, staleness_max=1, migrations=step,
                role_map={"trainer": 1, "rollout": 3}, role_map_desc="T[0] | short:[1] long:[2,3]",
                idle_frac_rollout=0.3, idle_frac_train=0.8, policy_version=step, extra={"train/loss": 0.25})
    return MetricsRow(**{**base, **kw})


def test_a_metrics_row_has_the_design_fields_and_round_trips_through_json():
    r = row(3)
    d = json.loads(json.dumps(r.to_dict()))
    assert set(METRIC_FIELDS) <= set(d) and d["train/loss"] == 0.25  # extras are flat slash keys
    assert MetricsRow.from_dict(d) == r


@pytest.mark.parametrize("step_s,rollout_s,train_s,sync_s", [(10, 7, 2, 0.5), (1, 5, 3, 2), (0, 0, 0, 0), (5, 0, 9, 0)])
@pytest.mark.parametrize("colocated", [False, True])
def test_idle_fractions_lie_in_the_unit_interval(step_s, rollout_s, train_s, sync_s, colocated):
    fr, ft = idle_fractions(step_s=step_s, rollout_s=rollout_s, train_s=train_s, sync_s=sync_s, colocated=colocated)
    assert 0.0 <= fr <= 1.0 and 0.0 <= ft <= 1.0


def test_idle_fractions_follow_who_is_busy():
    # disaggregated: rollout busy 7 of 10 s, trainer busy 2 of 10 s
    assert idle_fractions(step_s=10, rollout_s=7, train_s=2, sync_s=0.5, colocated=False) == (0.3, 0.8)
    # colocated: the same ranks roll out except while training and syncing
    assert idle_fractions(step_s=10, rollout_s=7, train_s=2, sync_s=0.5, colocated=True) == (0.25, 0.8)


def test_summary_holds_the_design_fields_and_finds_the_time_to_target():
    rows = [row(1, 0.1).to_dict(), row(2, 0.4, staleness_max=3).to_dict(), row(3, 0.6).to_dict()]
    s = summarize(rows, bench="swe", system="libra", mode="real", wall_s=30.0, dropped={"stale": 2}, peak_rss_mb=100.0,
                  reward_target=0.35)
    assert set(SUMMARY_FIELDS) <= set(s)
    assert s["tokens_per_s"] == pytest.approx(3000 / 30.0) and s["trajectories"] == 24
    assert s["dropped"] == {**{k: 0 for k in DROP_REASONS}, "stale": 2}
    assert s["time_to_target_s"] == 20.0 and s["reward_first"] == 0.1 and s["reward_last"] == 0.6
    assert s["migrations"] == 3  # rows carry a running total, not per-step counts
    assert s["staleness_max"] == 3  # the largest trained lag of the run, whichever step had it
    assert summarize([], bench="swe", system="x", mode="real", wall_s=0.0, dropped={}, peak_rss_mb=0.0)["steps"] == 0


def test_the_story_says_what_was_learned_what_moved_what_it_paid_and_where_the_plot_is(tmp_path):
    rewards = [0.25, 0.0, 0.5, 0.5, 0.75, 0.75, 1.0, 0.75, 1.0]
    rows = [row(i + 1, r, reconfig_s=2.0 if i == 3 else 0.0, extra={"train/stepped": int(i != 1)}).to_dict()
            for i, r in enumerate(rewards)]
    s = summarize(rows, bench="swe", system="libra", mode="real", wall_s=90.0, dropped={}, peak_rss_mb=1.0,
                  role_map_changes=1, planner_notes=[[0, "started on A"], [1, "kept A: no gain"], [2, "kept A: no gain"],
                                                     [3, "moved to B"]])
    story = run_story(s, rows, tmp_path)
    assert story[1] == ("- learned: reward per step 0.25, 0.00, 0.50, 0.50, 0.75, 0.75, 1.00, 0.75, 1.00; the last 3 steps' "
                        "mean 0.92 against the first 3 steps' mean 0.25; 1 of 9 steps trained nothing: every group's "
                        "rewards were equal, so GRPO had no signal.")
    assert story[2:7] == ["- moved: C-MLFQ moved 9 trajectories to a longer bucket mid-run, re-prefilled there.",
                          "- moved: the layout changed 1 time: T[0] | short:[1] long:[2,3] -> T[0] | short:[1] long:[2,3].",
                          "- moved: the planner before step 1: started on A.",  # libra's first design
                          "- moved: the planner after step 1: kept A: no gain.",  # said once, not at every check
                          "- moved: the planner after step 3: moved to B."]
    assert story[7] == "- paid: layout changes 2.0 s in all; on average the rollout ranks idled 30% of a step and the trainer 80%."
    assert str(tmp_path / "plot.png") in story[8]
    few = run_story(summarize(rows[:3], bench="swe", system="libra", mode="real", wall_s=1.0, dropped={}, peak_rss_mb=1.0),
                    rows[:3], tmp_path)
    assert "(3 steps are too few to tell learning from sampling noise)" in few[1]


def test_plot_run_draws_the_steps_of_a_run(tmp_path):
    w = RunWriter(tmp_path)
    for i in range(3):
        w.metrics(row(i + 1).to_dict())
    assert plot_run(tmp_path).stat().st_size > 10_000
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="has no steps yet"):
        plot_run(tmp_path / "empty")


def test_writer_appends_rows_and_resume_truncates_after_the_checkpoint(tmp_path):
    w = RunWriter(tmp_path)
    for step in (1, 2, 3):
        w.metrics(row(step).to_dict())
        w.trajectory({"step": step, "request_id": f"r{step}"})
        w.sample({"step": step, "request_id": f"r{step}"})
        w.span(f"train step {step}", "trainer", 10.0 * step - 2.0, 2.0)
    w.trace()
    assert [m["step"] for m in read_metrics(tmp_path)] == [1, 2, 3]
    resumed = RunWriter(tmp_path)
    kept = resumed.truncate_to_step(2, wall_s=20.0)
    assert [m["step"] for m in kept] == [1, 2] == [m["step"] for m in read_metrics(tmp_path)]
    for name in ("trajectories.jsonl", "trajectories_sample.jsonl"):
        assert [json.loads(x)["request_id"] for x in (tmp_path / name).read_text().splitlines()] == ["r1", "r2"]
    assert [e["name"] for e in resumed.trace_events] == ["train step 1", "train step 2"]  # continued by the resumed run
    with pytest.raises(AssertionError, match="lacks"):
        w.metrics({"step": 4})


def test_trace_json_is_a_trace_event_list(tmp_path):
    w = RunWriter(tmp_path)
    w.span("rollout", 1, 0.0, 1.5, step=1)
    w.span("train", "trainer", 1.5, -1.0)
    w.trace()
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert [e["dur"] for e in spans] == [1.5e6, 0.0] and {e["ph"] for e in events} == {"X", "M"}


def test_a_failing_write_is_reported_once_and_never_raised(tmp_path, caplog):
    w = RunWriter(tmp_path)
    (tmp_path / "metrics.jsonl").mkdir()  # writing the file now fails with IsADirectoryError
    with caplog.at_level(logging.ERROR):
        for step in (1, 2, 3):
            w.metrics(row(step).to_dict())
    assert len([r for r in caplog.records if "metrics.jsonl" in r.getMessage()]) == 1


def test_ratios_and_table_read_real_and_simulated_summaries_alike():
    systems = {"colocate": {"tokens_per_s": 100.0, "trajectories_per_s": 1.0, "time_to_target_s": 50.0},
               "libra": {"tokens_per_s": 150.0, "trajectories_per_s": 1.5, "time_to_target_s": 25.0},
               "oracle": {"tokens_per_s": 200.0, "trajectories_per_s": 2.0, "time_to_target_s": None}}
    add_ratios(systems)
    assert systems["libra"]["vs_colocate"] == 1.5 and systems["libra"]["vs_oracle"] == 0.75
    assert systems["libra"]["reward_speedup_vs_colocate"] == 2.0 and systems["oracle"]["reward_speedup_vs_colocate"] is None
    table = format_table({"bench": "swe", "mode": "real", "systems": systems})
    assert len(table.splitlines()) == 3 + 3 and not any("nan" in line for line in table.splitlines())
    assert not math.isnan(systems["colocate"]["vs_oracle"])
