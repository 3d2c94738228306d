"""sim/oracle.py: the oracle places each trajectory once where it finishes first and never
migrates; no system's throughput beats the oracle's on the same workload and seed (the swe case
is in tests/sim/test_sim_run.py, other workloads here); the oracle migrates only when libra's own
schedule is the best one known."""

import pytest

from scheduler.api import OutcomeState
from scheduler.costmodel import get_cost_model
from scheduler.layout import BucketsConfig, split_role_map
from sim.config import SimConfig
from sim.oracle import OracleRouter
from sim.run import compare
from sim.workload import TrajSpec

SMALL = SimConfig(bench="swe", model="qwen3-4b", num_devices=8, steps=4, prompts_per_step=8, samples_per_prompt=4)


def spec(rid: str, tokens: int) -> TrajSpec:
    return TrajSpec(request_id=rid, prompt_id="p", prompt_tokens=100, turn_tokens=(tokens,), tool_outcomes=(),
                    tool_output_tokens=(), tool_latency_s=())


def router(rollout_tp=(("short", 1), ("short", 1), ("long", 2))):
    r = OracleRouter(get_cost_model("h100", "qwen3-4b"), max_seqs_per_instance=64)
    rm = split_role_map(world_size=8, num_trainer=4, rollout_tp=rollout_tp, buckets=BucketsConfig().buckets())
    r.set_layout(rm, 0.0)
    return r


def test_a_long_trajectory_goes_to_the_fast_instance_and_never_moves():
    r = router()
    r.know([spec("long", 30000), spec("short", 200)])
    assert r.admit("long", "p", 100, 0.0).instance_id == 2  # the TP=2 instance decodes each token fastest
    for tokens in (1000, 20000):
        assert r.on_decode("long", tokens, 1.0).action == "stay"
        assert r.on_tool_return("long", OutcomeState("run_tests", "small", "failure"), tokens, 1.0).action == "stay"
    r.on_finish("long", 30000, 2.0)
    assert r.load[2] == 0.0


def test_load_spreads_over_equal_instances():
    r = router((("short", 1),) * 2 + (("long", 1),) * 2)
    r.know([spec(f"r{i}", 500) for i in range(8)])
    placed = [r.admit(f"r{i}", "p", 100, 0.0).instance_id for i in range(8)]
    assert sorted(placed) == [0, 0, 1, 1, 2, 2, 3, 3]  # equal instances: the queue decides, so each gets two


@pytest.mark.parametrize("bench,seed", [("search", 1), ("math", 2)])
def test_no_system_beats_the_oracle_on_other_workloads(bench, seed):
    cfg = SMALL.replace(bench=bench, seed=seed)
    systems = compare(cfg, ["libra", "colocate", "static", "la_mlfq", "oracle"], None)["systems"]
    assert max(s["tokens_per_s"] for s in systems.values()) == systems["oracle"]["tokens_per_s"]
    oracle = systems["oracle"]
    assert oracle["migrations"] == 0 or oracle["oracle_schedule_from"] == "libra (own router)"  # C-MLFQ's own best
