"""scheduler/elastic.py: which idle rollout instances help train a batch, and the planners that ask it."""

import dataclasses
from pathlib import Path

from scheduler.costmodel import HARDWARE, MODELS, CostModel, get_cost_model
from scheduler.design_planner import DesignPlanner
from scheduler.elastic import MIN_GAIN_FRAC, elastic_helpers
from scheduler.layout import BucketsConfig, split_role_map
from scheduler.planner import GlobalPlanner, PlannerConfig
from scheduler.profile import HardwareProfile, ProfiledCostModel
from scheduler.systems import make_planner

A800_14B = get_cost_model("a800", "qwen3-14b")


def test_on_a_big_batch_helpers_join_in_id_order_while_each_makes_the_update_faster():
    tokens, k = 10**6, 1
    chosen = elastic_helpers(A800_14B, tokens, k, [9, 3, 7, 5])
    assert chosen == (3, 5, 7, 9)[:len(chosen)] and chosen  # a prefix of the sorted candidates
    times = [A800_14B.elastic_train_s(tokens, k, h) for h in range(len(chosen) + 1)]
    assert all(b < a * (1 - MIN_GAIN_FRAC) for a, b in zip(times, times[1:]))


def test_the_greedy_stops_where_a_helper_gains_less_than_the_threshold():
    many = list(range(40))
    chosen = elastic_helpers(A800_14B, 10**6, 8, many)
    h = len(chosen)
    assert 0 < h < len(many)  # the split's gain per helper shrinks: not every idle instance pays
    assert not A800_14B.elastic_train_s(10**6, 8, h + 1) < A800_14B.elastic_train_s(10**6, 8, h) * (1 - MIN_GAIN_FRAC)


def test_a_huge_model_over_a_slow_link_takes_no_helper():
    slow = CostModel(dataclasses.replace(HARDWARE["a800"], link_bw_bytes_s=1e9), MODELS["qwen3-14b"])
    # a 59 GB float32 gradient over 1 GB/s costs a minute; the split saves a few seconds of a 21 s update
    assert slow.train_s(10**5, 4) < 25 and slow.grad_handoff_s(4, 1) > 55
    assert elastic_helpers(slow, 10**5, 4, [1, 2, 3]) == ()
    assert elastic_helpers(A800_14B, 10**5, 4, [1, 2, 3])  # the same batch over NVLink: they pay


def test_no_helper_without_tokens_candidates_or_room_for_a_gradient():
    assert elastic_helpers(A800_14B, 0, 1, [1, 2]) == ()
    assert elastic_helpers(A800_14B, 10**6, 1, []) == ()
    assert elastic_helpers(get_cost_model("910b3", "qwen3-30b-a3b"), 10**6, 1, [1, 2]) == ()


def test_on_two_shared_cores_one_helper_beside_one_trainer_rank_and_no_more():
    cm = ProfiledCostModel(HardwareProfile.load(Path(__file__).with_name("smollm2-cpu-profile.json")))
    assert elastic_helpers(cm, 8192, 1, [4, 5, 6]) == (4,)
    assert elastic_helpers(cm, 64, 1, [4, 5, 6]) == ()  # a small batch does not pay for a 1.4 s hand-off


def test_the_libra_planners_answer_with_their_cost_model_and_the_trainer_ranks_of_the_layout():
    buckets = BucketsConfig()
    rm = split_role_map(world_size=16, num_trainer=8, rollout_tp=(("short", 1),) * 4 + (("long", 4),),
                        buckets=buckets.buckets())
    split = make_planner("libra-no-design", 16, A800_14B, 10, PlannerConfig(), current=rm, buckets=buckets)
    design = make_planner("libra", 16, A800_14B, 10, PlannerConfig(), current=rm, buckets=buckets)
    assert isinstance(split, GlobalPlanner) and isinstance(design, DesignPlanner)
    want = elastic_helpers(A800_14B, 10**6, 8, (1, 2, 3))
    assert want and split.elastic_helpers(10**6, rm, (1, 2, 3)) == want == design.elastic_helpers(10**6, rm, (1, 2, 3))
