"""The step core's elastic joins (`CoreConfig.elastic`): which idle rollout instances it offers a batch, and the row's
count of those that helped. The core's other invariants: tests/steps/test_stepcore.py; the fakes: tests/stepcore_helpers.py."""

from scheduler.layout import colocated_role_map, split_role_map
from steps.commands import CoreConfig, Export
from steps.core import StepCore
from stepcore_helpers import BUCKETS, FAIL, FakePlanner, FakeRouter, admit, finish


class HelpPlanner(FakePlanner):
    """Lets every idle instance it is offered help; records what it was asked."""

    def __init__(self):
        super().__init__()
        self.asked = []

    def elastic_helpers(self, num_tokens, role_map, candidates):
        self.asked.append((num_tokens, role_map.version, candidates))
        return tuple(reversed(candidates))  # the core hands them out sorted, whatever order it gets


def elastic_core(*, elastic=True, planner=None, role_map=None, rewards=(1.0, 0.0)):
    """Instance 0 (TP1) takes every admission, 1 is TP2, 2 (TP1, rank 4) is where a failing tool migrates to.
    Step 0's group earns `rewards` (different by default: the batch has a signal to train)."""
    role_map = role_map or split_role_map(world_size=5, num_trainer=1, rollout_tp=(("short", 1), ("short", 2), ("long", 1)),
                                          buckets=BUCKETS)
    c = StepCore(CoreConfig(num_steps=3, max_staleness=1, lookahead=1, elastic=elastic), FakeRouter(), planner, role_map)
    c.start(0.0)
    admit(c)
    admit(c)  # step 1 runs on instance 0 while step 0 trains
    finish(c, "s0-0", 2.0, reward=rewards[0])
    finish(c, "s0-1", 2.0, tokens=60, reward=rewards[1])
    return c


def test_only_an_idle_tp1_instance_off_the_trainer_is_offered_and_the_row_counts_the_helpers():
    planner = HelpPlanner()
    c = elastic_core(planner=planner)
    assert c.idle_instances() == (2,)  # 0 runs step 1, 1 is TP2
    batch = c.take_batch(2.0)
    assert batch.helpers == (2,) and planner.asked == [(110, 0, (2,))]  # the batch's tokens, the layout in force
    c.on_trained(train_s=1.0)  # the core counts them itself: a real row and a simulated one alike
    assert c.end_step(3.0, sync_s=0.1).row.to_dict()["train/elastic_helpers"] == 1


def test_an_instance_a_request_is_moving_to_is_not_idle():
    planner = HelpPlanner()
    c = elastic_core(planner=planner)
    assert c.on_tool_return("s1-0", FAIL, 30, 2.0) == Export("s1-0", 0)  # exported towards instance 2
    assert c.idle_instances() == ()
    assert c.take_batch(2.0).helpers == () and planner.asked == []  # nothing to offer: the planner is not asked


def test_without_elastic_or_a_planner_that_decides_no_instance_helps():
    planner = HelpPlanner()
    c = elastic_core(elastic=False, planner=planner)
    assert c.take_batch(2.0).helpers == () and planner.asked == []
    c.on_trained(train_s=1.0)
    assert "train/elastic_helpers" not in c.end_step(3.0, sync_s=0.1).row.to_dict()
    for planner in (None, FakePlanner()):  # none, or one that has no say on helpers
        assert elastic_core(planner=planner).take_batch(2.0).helpers == ()
    planner = HelpPlanner()  # a batch whose group earned equal rewards trains nothing: no gradient to help with
    assert elastic_core(planner=planner, rewards=(1.0, 1.0)).take_batch(2.0).helpers == () and planner.asked == []


def test_colocated_ranks_train_already_and_a_layout_change_offers_no_helper():
    colocated = colocated_role_map(world_size=3, tp=1)
    planner = HelpPlanner()
    c = StepCore(CoreConfig(num_steps=2, max_staleness=1, lookahead=0, elastic=True), FakeRouter(), planner, colocated)
    c.start(0.0)
    admit(c)
    for rid in ("s0-0", "s0-1"):
        finish(c, rid, 1.0)
    assert c.idle_instances() == () and c.take_batch(1.0).helpers == ()  # every instance sits on a trainer rank
    c = elastic_core(planner=planner)
    c.begin_reconfigure(c.role_map)  # the same layout again: nothing moves, but the change is under way
    assert c.idle_instances() == () and c.take_batch(2.0).helpers == () and planner.asked == []
