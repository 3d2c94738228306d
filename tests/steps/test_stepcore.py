"""The step core driven by hand (as vLLM's scheduler tests drive theirs): admission with lookahead,
the ledger, stale drops, metrics rows and planner stats, migrations, drains for a new layout."""

import pytest

from runlog import METRIC_FIELDS, PREDICTED_KEY, forecast_error
from scheduler.layout import colocated_role_map
from steps.commands import CoreConfig, Export, RunState
from steps.core import StepCore, has_signal
from stepcore_helpers import BUCKETS, FAIL, FakePlanner, FakeRouter, admit_groups, admit, finish, layout, make_core


def test_admission_runs_at_most_lookahead_steps_ahead_of_the_trainer():
    c = make_core(lookahead=1)
    assert [a.request_id for a in admit(c)] == ["s0-0", "s0-1"]
    admit(c)
    assert c.next_admissible() is None  # step 2 waits until step 0 is trained
    sync = make_core(lookahead=0)
    admit(sync)
    assert sync.next_admissible() is None


def test_a_step_trains_in_request_order_and_the_row_says_what_happened():
    planner = FakePlanner()
    c = make_core(planner=planner)
    admit(c, now=1.0)
    finish(c, "s0-1", 3.0, tokens=60)
    assert c.take_batch(3.0) is None  # s0-0 still runs
    finish(c, "s0-0", 4.0)
    batch = c.take_batch(4.0)
    assert batch.payloads == ("s0-0", "s0-1") and batch.policy_version == 0
    assert c.take_batch(4.0) is None  # one batch in training at a time
    c.on_trained(train_s=2.0, metrics={"train/loss": 0.5, "train/stepped": 1, "note": "x"})
    end = c.end_step(6.5, sync_s=0.5)
    row = end.row.to_dict()
    assert set(METRIC_FIELDS) <= set(row)
    assert (row["step"], row["time_s"], row["step_s"], row["rollout_s"], row["train_s"]) == (1, 6.5, 6.5, 3.0, 2.0)
    assert (row["tokens"], row["trajectories"], row["reward_mean"], row["policy_version"]) == (110, 2, 1.0, 1)
    assert row["train/loss"] == 0.5 and "note" not in row  # only numbers reach the metrics
    stats = planner.stats[0]
    assert stats.trajectory_tokens == (50, 60) and stats.decode_tokens == (40, 50) and stats.train_s == 2.0
    assert stats.tool_latency_s == (0.5, 0.5) and stats.train_tokens == 110
    assert stats.signal_tokens == (30, 40)  # each trajectory's tokens at its first tool return, in batch order
    assert c.trained == 1 and c.version == 1 and c.ledger.trained_order == ["task0", "task0"]
    assert PREDICTED_KEY not in row  # nothing was foreseen before the first step


def test_each_row_carries_the_planners_forecast_made_before_its_step():
    planner = FakePlanner()
    c = make_core(planner=planner, steps=3)
    rows, notes = [], []
    for s in range(2):
        admit(c, now=10.0 * s)
        for i in range(2):
            finish(c, f"s{s}-{i}", 10.0 * s + 1)
        c.take_batch(10.0 * s + 1)
        c.on_trained(train_s=1.0)
        end = c.end_step(10.0 * s + 2, sync_s=0.0)
        rows.append(end.row.to_dict())
        notes.append(end.planner_notes)
    assert PREDICTED_KEY not in rows[0] and rows[1][PREDICTED_KEY] == 10.0  # foreseen at the end of step 1
    assert notes == [("checked after step 1",), ("checked after step 2",)]  # what the planner concluded, each step end
    assert forecast_error([{**rows[1], "step_s": 8.0}]) == {"planner_forecast_steps": 1, "planner_predicted_step_s": 10.0,
                                                             "planner_measured_step_s": 8.0, "planner_forecast_error": 0.25}


def test_a_finish_order_step_tells_the_planner_how_far_its_running_trajectories_got():
    planner = FakePlanner()
    c = StepCore(CoreConfig(num_steps=3, max_staleness=1, lookahead=1, batch_by_finish=True), FakeRouter(), planner,
                 layout())
    c.start(0.0)
    admit(c, n=2)
    admit(c, n=2)
    c.on_decode("s1-0", 700, 1.0)  # a long one of step 1, still running
    finish(c, "s0-0", 2.0)
    finish(c, "s0-1", 2.0)
    c.take_batch(2.0)
    c.on_trained(train_s=1.0)
    c.end_step(3.0, sync_s=0.0)
    assert planner.stats[0].trajectory_tokens == (50, 50) and planner.stats[0].censored_tokens == (700,)


def test_the_first_step_a_run_trains_is_checkpointed_also_after_a_resume():
    for state in (None, RunState(step=5, policy_version=5, role_map=layout(), prefix_tree=None, ledger={})):
        c = StepCore(CoreConfig(num_steps=9, max_staleness=1, lookahead=0, checkpoint_first=True), FakeRouter(), None,
                     layout(), state=state)
        c.start(0.0)
        due = []
        for s in range(2):
            admit(c)
            for i in range(2):
                finish(c, f"s{c.trained}-{i}", 1.0 + s, version=c.version)
            c.take_batch(1.0 + s)
            c.on_trained(train_s=0.1)
            due.append(c.end_step(1.5 + s, sync_s=0.0).checkpoint)
        assert due == [True, False]


def test_the_row_counts_why_each_reward_is_what_it_is():
    c = make_core()
    admit(c, n=3)
    for rid, reason in (("s0-0", "tests_failed"), ("s0-1", "passed"), ("s0-2", "tests_failed")):
        finish(c, rid, 1.0, reason=reason)
    c.take_batch(1.0)
    c.on_trained(train_s=0.1)
    row = c.end_step(1.5, sync_s=0.0).row.to_dict()
    assert row["score/tests_failed"] == 2 and row["score/passed"] == 1
    assert not any(k.startswith("dropped/") for k in row)  # nothing was dropped


def test_finish_order_batches_take_the_first_complete_groups_from_any_step():
    """fully-async / partial-rollout: a long group does not hold the batch; admission stays bounded."""
    c = StepCore(CoreConfig(num_steps=3, max_staleness=1, lookahead=1, batch_by_finish=True), FakeRouter(), None, layout())
    c.start(0.0)

    admit_groups(c, 0.0)
    admit_groups(c, 0.0)
    assert c.next_admissible() is None  # lookahead 1: two steps in flight at most
    for rid in ("s0-g0-0", "s0-g0-1", "s1-g1-0", "s1-g1-1", "s0-g1-0"):  # s0-g1 waits on its long member
        finish(c, rid, 1.0)
    batch = c.take_batch(2.0)
    assert batch.request_ids == ("s0-g0-0", "s0-g0-1", "s1-g1-0", "s1-g1-1") and batch.step == 0
    c.on_trained(train_s=1.0)
    row = c.end_step(3.0, sync_s=0.0).row
    assert (row.step, row.trajectories, row.rollout_s) == (1, 4, 2.0)
    assert c.next_admissible() == 2  # one batch trained: one more step may start
    finish(c, "s0-g1-1", 4.0, version=0)  # two versions late by now: trained, its lag reported
    for rid in ("s1-g0-0", "s1-g0-1"):
        finish(c, rid, 4.0)
    batch = c.take_batch(4.0)
    assert set(batch.request_ids) == {"s0-g1-0", "s0-g1-1", "s1-g0-0", "s1-g0-1"}
    assert 0 not in c.steps and 1 not in c.steps  # both admitted steps are used up
    c.on_trained(train_s=1.0)
    c.end_step(5.0, sync_s=0.0)
    c.cancel_all(6.0)
    assert c.ledger.counts()["trained"] == 8


def test_libras_finish_order_batches_wait_for_a_group_a_later_batch_would_train_past_the_bound():
    """bound_trained_lag (libra's designs): the same race as above, but s0-g1 and s1-g0 would be trained two versions
    after their admission by the next batch: this one waits for them, and no trajectory trains above the bound."""
    c = StepCore(CoreConfig(num_steps=3, max_staleness=1, lookahead=1, batch_by_finish=True, bound_trained_lag=True),
                 FakeRouter(), None, layout())
    c.start(0.0)
    admit_groups(c, 0.0)
    admit_groups(c, 0.0)
    for rid in ("s0-g0-0", "s0-g0-1", "s1-g1-0", "s1-g1-1", "s0-g1-0"):
        finish(c, rid, 1.0)
    assert c.take_batch(2.0).request_ids == ("s0-g0-0", "s0-g0-1", "s1-g1-0", "s1-g1-1")  # nothing is due at version 0
    c.on_trained(train_s=1.0)
    c.end_step(3.0, sync_s=0.0)
    admit_groups(c, 3.0)
    for rid in ("s1-g0-0", "s1-g0-1", "s2-g0-0", "s2-g0-1", "s2-g1-0", "s2-g1-1"):
        finish(c, rid, 4.0, version=int(rid[1]) // 2)  # step 2 was admitted on version 1
    assert c.take_batch(4.0) is None  # three groups are in, but s0-g1 is due and still runs
    finish(c, "s0-g1-1", 5.0)
    batch = c.take_batch(5.0)
    assert set(batch.request_ids) == {"s0-g1-0", "s0-g1-1", "s1-g0-0", "s1-g0-1"}  # the due groups, first
    c.on_trained(train_s=1.0)
    row = c.end_step(6.0, sync_s=0.0).row
    assert row.staleness_max == 1
    batch = c.take_batch(6.0)  # step 2's groups are due now
    assert set(batch.request_ids) == {"s2-g0-0", "s2-g0-1", "s2-g1-0", "s2-g1-1"}
    c.on_trained(train_s=1.0)
    assert c.end_step(7.0, sync_s=0.0).row.staleness_max <= 1
    assert c.ledger.counts()["trained"] == 12


def test_a_skipped_update_reports_no_training_time_to_the_planner():
    planner = FakePlanner()
    c = make_core(planner=planner)
    admit(c)
    for rid in ("s0-0", "s0-1"):
        finish(c, rid, 1.0)
    c.take_batch(1.0)
    c.on_trained(train_s=0.3, stepped=False, metrics={"train/stepped": 0})
    c.end_step(1.5, sync_s=0.1)
    assert planner.stats[0].train_s == 0.0


def test_whether_the_trainer_stepped_is_a_named_field_not_a_metrics_key():
    planner = FakePlanner()
    c = make_core(planner=planner)
    admit(c)
    for rid in ("s0-0", "s0-1"):
        finish(c, rid, 1.0)
    c.take_batch(1.0)
    c.on_trained(train_s=0.3, metrics={"train/stepped": 0})  # metrics are only reported
    assert c.end_step(1.5, sync_s=0.1).row.to_dict()["train/stepped"] == 0
    assert planner.stats[0].train_s == 0.3


def test_the_no_signal_rule():
    assert not has_signal([("g0", 1.0), ("g0", 1.0), ("g1", 0.0), ("g1", 0.0)])  # every group's rewards are equal
    assert has_signal([("g0", 1.0), ("g0", 1.0), ("g1", 0.0), ("g1", 0.5)])
    assert not has_signal([("g0", 1.0), ("g1", 0.0)])  # different groups never compare
    assert has_signal([("g0", 1.0), ("g0", None)])  # an unknown reward counts as signal
    assert not has_signal([])


def test_stale_and_infra_trajectories_are_dropped_with_their_reason():
    c = make_core(steps=5, lookahead=2, max_staleness=0)
    admit(c)  # step 0 at version 0
    admit(c)  # step 1, also generated at version 0
    for rid in ("s0-0", "s0-1"):
        finish(c, rid, 1.0)
    finish(c, "s1-0", 1.0, infra=True)
    finish(c, "s1-1", 1.0, version=0)
    c.take_batch(1.0)
    c.on_trained(train_s=1.0)
    c.end_step(2.0, sync_s=0.0)
    batch = c.take_batch(2.0)  # version 1 now: s1-1 is one version old, beyond max_staleness=0
    assert batch.payloads == ()
    end = c.end_step(2.5, sync_s=0.0)  # an empty batch trains nothing
    assert (end.row.trajectories, end.row.train_s, c.version) == (0, 0.0, 1)
    # the row says why its trajectories are missing
    assert {k: v for k, v in end.row.to_dict().items() if k.startswith("dropped/")} == {"dropped/stale": 1, "dropped/tool_infra": 1}
    c.cancel_all(3.0)
    assert c.ledger.counts() == {"started": 4, "trained": 2, "dropped": {"tool_infra": 1, "stale": 1}}


def test_a_failing_tool_migrates_and_a_finish_during_the_export_still_counts():
    c = make_core()
    admit(c)
    e = c.on_tool_return("s0-0", FAIL, 30, 1.0)
    assert e == Export("s0-0", 0)
    assert c.on_tool_return("s0-0", FAIL, 40, 1.1) is None  # already moving: no second export
    add = c.on_exported("s0-0", 1.2)
    assert (add.instance_id, add.resumed, c.migrations) == (1, True, 1)
    assert c.on_tool_return("s0-1", FAIL, 30, 1.3) is not None
    finish(c, "s0-1", 1.4)  # finished before its export was served: the result stands
    c.on_export_failed("s0-1")
    assert c.steps[0].done["s0-1"] is not None and "s0-1" not in c.requests


def test_a_layout_that_keeps_the_instances_drains_nothing_but_parks_migrations():
    c = make_core()
    admit(c)
    new, exports = c.begin_reconfigure(layout(rollout=(("short", 1), ("short", 1))))  # same ranks: same instances
    assert new.version == 1 and exports == []
    assert c.on_tool_return("s0-0", FAIL, 30, 1.0) is not None  # a migration during the change...
    assert c.next_admissible() is None  # admission pauses during a layout change
    assert c.on_exported("s0-0", 1.1) is None  # ...is parked until the new layout
    assert c.drained()
    adds = c.finish_reconfigure(1.2)
    assert [(a.request_id, a.instance_id, a.resumed) for a in adds] == [("s0-0", 1, True)]
    assert c.role_map.version == 1 and c.next_admissible() == 1


def test_requests_on_a_removed_instance_are_exported_and_the_drain_waits_for_them():
    c = make_core()
    admit(c)
    c.on_tool_return("s0-0", FAIL, 30, 1.0)
    c.on_exported("s0-0", 1.0)  # s0-0 runs on instance 1 now; s0-1 on instance 0
    _, exports = c.begin_reconfigure(layout(rollout=(("long", 1),), num_trainer=2))  # rank 1 trains: instance 0 goes
    assert exports == [Export("s0-1", 0)]
    assert not c.drained()
    c.on_export_failed("s0-1")  # it was in a tool call: exported at its next event
    assert c.on_decode("s0-1", 50, 1.5) == Export("s0-1", 0)
    c.on_exported("s0-1", 1.6)
    assert c.drained()
    c.add_reconfig_s(4.0)
    adds = c.finish_reconfigure(2.0)
    assert [(a.request_id, a.instance_id) for a in adds] == [("s0-1", 1)]  # re-homed by the router
    for rid in ("s0-0", "s0-1"):
        finish(c, rid, 3.0)
    c.take_batch(3.0)
    c.on_trained(train_s=1.0)
    assert c.end_step(4.0, sync_s=0.0).row.reconfig_s == 4.0


def test_the_run_state_round_trips_and_resumes_where_it_stopped():
    c = make_core()
    admit(c)
    for rid in ("s0-0", "s0-1"):
        finish(c, rid, 1.0)
    c.take_batch(1.0)
    c.on_trained(train_s=1.0)
    c.end_step(2.0, sync_s=0.0)
    state = c.state()
    assert RunState.from_dict(state.to_dict()) == state
    resumed = make_core(state=state)
    assert (resumed.trained, resumed.version, resumed.next_admissible()) == (1, 1, 1)
    assert resumed.ledger.trained_order == ["task0", "task0"]


def test_checkpoints_are_due_every_n_steps_but_not_at_the_end():
    c = StepCore(CoreConfig(num_steps=2, max_staleness=1, lookahead=0, checkpoint_every=1), FakeRouter(), None, layout())
    c.start(0.0)
    due = []
    for _ in range(2):
        s = c.next_admissible()
        admit(c)
        for rid in (f"s{s}-0", f"s{s}-1"):
            finish(c, rid, 1.0, version=c.version)
        c.take_batch(1.0)
        c.on_trained(train_s=1.0)
        due.append(c.end_step(2.0, sync_s=0.0).checkpoint)
    assert due == [True, False] and c.done


def test_checkpoints_are_due_by_run_time_too_and_a_resume_continues_the_clock():
    c = StepCore(CoreConfig(num_steps=5, max_staleness=1, lookahead=0, checkpoint_every_s=10.0), FakeRouter(), None,
                 layout())
    c.start(0.0)
    due, t = [], 0.0
    for _ in range(4):
        s = c.next_admissible()
        admit(c, now=t)
        for rid in (f"s{s}-0", f"s{s}-1"):
            finish(c, rid, t + 2.0, version=c.version)
        c.take_batch(t + 2.0)
        c.on_trained(train_s=1.0)
        t += 6.0
        due.append(c.end_step(t, sync_s=0.0).checkpoint)
    assert due == [False, True, False, True]  # at 12 s and 24 s of run time
    state = c.state()
    assert state.wall_s == 24.0 and state.ledger == {"started": 8, "trained": 8, "dropped": {}}
    resumed = StepCore(CoreConfig(num_steps=5, max_staleness=1, lookahead=0), FakeRouter(), None, layout(), state=state)
    resumed.start(30.0)
    admit(resumed, now=30.0)
    for rid in ("s4-0", "s4-1"):
        finish(resumed, rid, 31.0, version=resumed.version)
    resumed.take_batch(31.0)
    resumed.on_trained(train_s=1.0)
    row = resumed.end_step(33.0, sync_s=0.0).row
    assert (row.step, row.time_s, row.step_s) == (5, 33.0, 9.0)  # the step's time counts from the checkpoint's end
    resumed.cancel_all(33.0)
    assert resumed.ledger.counts() == {"started": 10, "trained": 10, "dropped": {}}


def test_config_errors_name_the_values():
    with pytest.raises(ValueError, match=r"num_steps=0 must be >= 1 and max_staleness=1, lookahead=-1"):
        CoreConfig(num_steps=0, max_staleness=1, lookahead=-1)


def test_signal_tokens_reach_the_planner_only_when_every_trajectory_has_one():
    planner = FakePlanner()
    c = make_core(planner=planner)
    admit(c)
    finish(c, "s0-0", 1.0)
    finish(c, "s0-1", 1.0, signal=0)  # unknown: the planner must not pair lengths with the wrong signals
    c.take_batch(1.0)
    c.on_trained(train_s=0.3)
    c.end_step(1.5, sync_s=0.1)
    assert planner.stats[0].signal_tokens == () and planner.stats[0].trajectory_tokens == (50, 50)


def _train(c, now):
    batch = c.take_batch(now)
    c.on_trained(train_s=1.0)
    return batch, c.end_step(now + 1, sync_s=0.0).row


def test_step_batches_become_finish_order_ones_at_once():
    """libra's planner switched design: the complete groups of the steps in flight are the first ready."""
    c = make_core(steps=4, lookahead=1)
    for _ in range(2):
        admit_groups(c, 0.0)
    for rid in ("s0-g0-0", "s0-g0-1", "s0-g1-0", "s0-g1-1", "s1-g1-0", "s1-g1-1"):
        finish(c, rid, 1.0)
    _, row = _train(c, 2.0)  # step 0, a step batch
    assert row.step == 1 and row.trajectories == 4
    c.set_design(lookahead=2, max_staleness=2, batch_by_finish=True)
    assert c.next_admissible() == 2  # lookahead 2 now
    admit_groups(c, 3.0)
    for rid in ("s2-g0-0", "s2-g0-1"):
        finish(c, rid, 4.0)
    batch, row = _train(c, 5.0)  # s1-g1 (complete before the switch) and s2-g0, not s1-g0 still running
    assert set(batch.request_ids) == {"s1-g1-0", "s1-g1-1", "s2-g0-0", "s2-g0-1"} and row.step == 2


def test_finish_order_batches_drain_before_step_batches_start():
    c = StepCore(CoreConfig(num_steps=5, max_staleness=1, lookahead=1, batch_by_finish=True), FakeRouter(), None, layout())
    c.start(0.0)
    admit_groups(c, 0.0)
    admit_groups(c, 0.0)
    for rid in ("s0-g0-0", "s0-g0-1", "s1-g1-0", "s1-g1-1"):
        finish(c, rid, 1.0)
    _train(c, 2.0)  # s0-g0 + s1-g1: both admitted steps are partly trained
    c.set_design(lookahead=0, max_staleness=1, batch_by_finish=False)
    assert c.cfg.batch_by_finish and c.next_admissible() is None  # the groups in flight go first, in finish order
    for rid in ("s0-g1-0", "s0-g1-1", "s1-g0-0", "s1-g0-1"):
        finish(c, rid, 3.0)
    batch, row = _train(c, 4.0)
    assert set(batch.request_ids) == {"s0-g1-0", "s0-g1-1", "s1-g0-0", "s1-g0-1"} and row.step == 2
    assert c.next_admissible() == 2 and not c.cfg.batch_by_finish  # drained: step batches, on-policy
    admit_groups(c, 5.0)
    assert c.next_admissible() is None  # lookahead 0
    for i in range(2):
        for g in range(2):
            finish(c, f"s2-g{g}-{i}", 6.0, version=2)  # generated on the weights after two updates: fresh
    batch, row = _train(c, 7.0)
    assert batch.step == 2 and row.step == 3 and len(batch.request_ids) == 4
    c.cancel_all(8.0)
    assert c.ledger.counts()["trained"] == 12


def test_a_plan_with_a_new_design_is_applied_by_the_core_at_the_step_end():
    """The caller (coordinator or simulator) only changes the layout; the lookahead and batching come with the plan."""
    from scheduler.api import PlanDecision

    plan = PlanDecision(role_map=layout(), predicted_step_s=1.0, current_step_s=2.0, reconfig_s=0.0,
                        lookahead=0, max_staleness=1, batch_by_finish=True)
    c = make_core(steps=3, lookahead=1, planner=FakePlanner(plan))
    admit_groups(c, 0.0)
    for rid in ("s0-g0-0", "s0-g0-1", "s0-g1-0", "s0-g1-1"):
        finish(c, rid, 1.0)
    c.take_batch(2.0)
    c.on_trained(train_s=1.0)
    assert c.end_step(3.0, sync_s=0.0).plan is plan
    assert (c.cfg.lookahead, c.cfg.batch_by_finish) == (0, True)


@pytest.mark.parametrize("colocated", [False, True])
def test_the_planner_hears_how_long_the_next_batch_has_generated(colocated):
    planner = FakePlanner()
    rm = colocated_role_map(world_size=2, tp=1) if colocated else layout()
    c = StepCore(CoreConfig(num_steps=3, max_staleness=1, lookahead=1), FakeRouter(), planner, rm)
    c.start(0.0)
    admit(c, now=0.0)
    admit(c, now=2.0)  # the next step starts a step ahead
    for i in range(2):
        finish(c, f"s0-{i}", 5.0)
    c.take_batch(5.0)
    c.on_trained(train_s=2.5)
    c.end_step(8.0, sync_s=0.5)
    # a split's rollout runs on while its trainer trains; colocated ranks stop generating to train
    assert planner.stats[0].ahead_s == (3.0 if colocated else 6.0)
    for i in range(2):
        finish(c, f"s1-{i}", 9.0)
    c.take_batch(9.0)
    c.on_trained(train_s=1.0)
    c.end_step(10.0, sync_s=0.0)
    assert planner.stats[1].ahead_s == 0.0  # the step after it was not admitted yet
