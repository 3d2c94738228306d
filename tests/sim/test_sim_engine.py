"""The event loop with hand-written fakes: exact timings, migrations' re-prefill, bucket-limit
checks, staleness bound, conservation, determinism (rows are the step core's metrics rows)."""

import dataclasses

import pytest

from scheduler.api import Decision, OutcomeState, PlanDecision, Route
from scheduler.layout import Bucket, colocated_role_map, split_role_map
from scheduler.routers import LeastLoadRouter
from sim.cluster import ClusterSim
from sim.instance import SimInstance, SimRequest
from sim.config import SimConfig
from sim.workload import TrajSpec
from steps.commands import group_id


class FakeCost:
    """Constant decode step, prefill linear in tokens, fixed train/sync/reconfig."""

    step_overhead_s = 0.0

    def kv_capacity_tokens(self, tp, mem_frac=0.9):
        return 1e12  # KV memory never binds here

    def decode_step_s(self, batch, context_tokens, tp):
        return 0.01

    def prefill_s(self, num_tokens, tp):
        return 0.001 * num_tokens

    def train_s(self, num_tokens, num_devices):
        return 2.0

    def train_measured_busy(self, num_devices):
        return num_devices

    def elastic_train_s(self, num_tokens, num_trainer, num_helpers):
        return 2.0 if not num_helpers else 1.2  # helpers halve the update; the hand-off costs 0.2

    def elastic_measured_busy(self, num_trainer, num_helpers):
        return num_trainer + num_helpers

    def sync_s(self, num_rollout_devices, num_trainer_devices=1, colocated=False):
        return 0.5

    def reconfig_s(self, num_moved_devices, trainer_moved=True, busy_ranks=0):
        return 3.0


class FakeWorkload:
    def __init__(self, specs_per_step):
        self.specs_per_step = specs_per_step

    def batch(self, step, num_prompts, samples_per_prompt):
        return [dataclasses.replace(s, request_id=f"s{step}-{s.request_id}") for s in self.specs_per_step]


class FakeRouter:
    """Admits to instance 0; migrates to instance 1 on a tool return when `migrate` is set."""

    def __init__(self, migrate=False):
        self.migrate = migrate
        self.calls = []

    def set_layout(self, role_map, now):
        self.calls.append(("layout", role_map.version))
        return {}

    def admit(self, request_id, prompt_id, prompt_tokens, now):
        self.calls.append(("admit", request_id, now))
        return Route(instance_id=0, bucket="short")

    def on_tool_return(self, request_id, outcome, tokens_so_far, now):
        self.calls.append(("tool", request_id, tokens_so_far))
        if self.migrate:
            return Decision(action="migrate", instance_id=1, bucket="long")
        return Decision(action="stay", instance_id=0, bucket="short")

    def on_decode(self, request_id, tokens_so_far, now):
        self.calls.append(("decode", request_id, tokens_so_far))
        return Decision(action="stay", instance_id=0, bucket="short")

    def on_finish(self, request_id, total_tokens, now):
        self.calls.append(("finish", request_id, total_tokens))

    def on_cancel(self, request_id, now):
        raise AssertionError("the simulator never cancels")


def _spec(rid="a", turns=(10, 20), out=(5,), latency=(1.0,), prompt=100, score_s=0.0):
    outcomes = tuple(OutcomeState("bash", "small", "success") for _ in out)
    return TrajSpec(request_id=rid, prompt_id="p0", prompt_tokens=prompt, turn_tokens=turns, tool_outcomes=outcomes,
                    tool_output_tokens=out, tool_latency_s=latency, score_s=score_s)


def _sim(specs, *, router=None, steps=1, lookahead=1, limit=None, max_staleness=1):
    cfg = SimConfig(num_devices=3, steps=steps, prompts_per_step=1, samples_per_prompt=1, max_staleness=max_staleness)
    rm = split_role_map(world_size=3, num_trainer=1, rollout_tp=(("short", 1), ("long", 1)),
                        buckets=(Bucket(name="short", max_tokens=limit or 10**9), Bucket(name="long", max_tokens=None)))
    return ClusterSim(cfg=cfg, cost=FakeCost(), workload=FakeWorkload(specs), router=router or FakeRouter(),
                      planner=None, role_map=rm, lookahead=lookahead, ctx_quantum=1, record=True)


def test_one_trajectory_exact_timeline():
    sim = _sim([_spec()])
    rows = sim.run()
    # prefill 100 tok (0.1) + 10 iters (0.1) -> tool 1.0 -> prefill 5 tok (0.005) + 20 iters (0.2)
    # = 1.405 finished; train 2.0 -> 3.405; sync 0.5 -> 3.905
    assert rows[0]["time_s"] == pytest.approx(3.905)
    assert rows[0]["rollout_s"] == pytest.approx(1.405)  # admitted at 0
    assert (rows[0]["train_s"], rows[0]["sync_s"]) == (2.0, 0.5)
    assert rows[0]["tokens"] == 135 and rows[0]["trajectories"] == 1
    assert sim.admitted[0].decode_done == 30
    assert sim.num_migrations == 0


def test_measured_episode_start_and_scoring_are_charged_like_the_runtime_pays_them():
    # the coordinator starts the step's two episodes one after the other (0.3 + 0.2) before any
    # request is sent; each final scoring (0.4) runs after the last turn, beside decoding
    specs = [dataclasses.replace(_spec(rid=r), start_s=s, score_s=0.4) for r, s in (("a", 0.3), ("b", 0.2))]
    cfg = SimConfig(num_devices=3, steps=1, prompts_per_step=1, samples_per_prompt=2)
    rm = split_role_map(world_size=3, num_trainer=1, rollout_tp=(("short", 1), ("long", 1)),
                        buckets=(Bucket(name="short", max_tokens=10**9), Bucket(name="long", max_tokens=None)))
    plain = ClusterSim(cfg=cfg, cost=FakeCost(), workload=FakeWorkload([_spec(rid="a"), _spec(rid="b")]),
                       router=FakeRouter(), planner=None, role_map=rm, lookahead=1, ctx_quantum=1).run()
    timed = ClusterSim(cfg=cfg, cost=FakeCost(), workload=FakeWorkload(specs), router=FakeRouter(), planner=None,
                       role_map=rm, lookahead=1, ctx_quantum=1).run()
    assert timed[0]["time_s"] == pytest.approx(plain[0]["time_s"] + 0.5 + 0.4)


def test_a_step_whose_groups_all_share_one_reward_trains_nothing_as_the_real_trainer_skips_it():
    def run(rewards):
        specs = [dataclasses.replace(_spec(rid=str(i)), reward=r) for i, r in enumerate(rewards)]
        cfg = SimConfig(num_devices=3, steps=1, prompts_per_step=1, samples_per_prompt=2)
        rm = split_role_map(world_size=3, num_trainer=1, rollout_tp=(("short", 1), ("long", 1)),
                            buckets=(Bucket(name="short", max_tokens=10**9), Bucket(name="long", max_tokens=None)))
        return ClusterSim(cfg=cfg, cost=FakeCost(), workload=FakeWorkload(specs), router=FakeRouter(), planner=None,
                          role_map=rm, lookahead=1, ctx_quantum=1).run()[0]["train_s"]

    assert run([0.0, 0.0]) == 0.0  # one group, no reward difference: zero gradient
    assert run([0.0, 1.0]) == 2.0
    assert run([None, None]) == 2.0  # unknown rewards (synthetic workloads) always train


def test_migration_reprefills_the_whole_context_on_the_target():
    sim = _sim([_spec()], router=FakeRouter(migrate=True))
    rows = sim.run()
    # the target prefills 100 + 10 + 5 = 115 tokens (0.115) instead of the 5 tool tokens (0.005)
    assert rows[0]["rollout_s"] == pytest.approx(1.515)
    assert sim.num_migrations == 1 and rows[0]["migrations"] == 1
    assert sim.admitted[0].instances == [0, 1]


def test_bucket_limit_triggers_a_decode_check_at_the_limit():
    router = FakeRouter()
    sim = _sim([_spec(turns=(100,), out=(), latency=(), prompt=10)], router=router, limit=50)
    sim.run()
    assert ("decode", "s0-a", 50) in router.calls
    assert ("finish", "s0-a", 110) in router.calls


def test_every_trajectory_finishes_once_and_tokens_are_conserved():
    specs = [_spec(rid=str(i), turns=(5 + i, 7 * i + 1, 3), out=(i, 2 * i), latency=(0.1 * i, 0.3)) for i in range(12)]
    router = FakeRouter()
    sim = _sim(specs, router=router, steps=3)
    rows = sim.run()
    finished = [c[1] for c in router.calls if c[0] == "finish"]
    assert len(finished) == len(set(finished)) == 36
    assert sum(r["tokens"] for r in rows) == 3 * sum(s.total_tokens for s in specs)
    assert sim.core.ledger.counts() == {"started": 36, "trained": 36, "dropped": {}}
    assert all(req.decode_done == req.spec.decode_tokens for req in sim.admitted)


@pytest.mark.parametrize("lookahead,bound", [(1, 1), (2, 2), (0, 0)])
def test_staleness_never_exceeds_the_bound(lookahead, bound):
    sim = _sim([_spec(rid=str(i)) for i in range(4)], steps=6, lookahead=lookahead, max_staleness=bound)
    rows = sim.run()
    stale = [r["staleness_max"] for r in rows]
    assert max(stale) == bound
    assert min(stale) == 0


def test_synchronous_steps_do_not_overlap():
    rows = _sim([_spec()], steps=2, lookahead=0).run()
    # each step: 1.405 rollout + 2.0 train + 0.5 sync; the second starts when the first ends
    assert [r["time_s"] for r in rows] == pytest.approx([3.905, 7.81])


def test_a_time_shared_layout_pauses_generation_while_its_ranks_train():
    """libra-hybrid: colocated ranks one step ahead. Step 2 is admitted when step 0 ends (4.01); its instance
    waits out step 1's training (2.0) and sync (0.5), re-prefills the KV the trainer took (0.1: an
    accelerator), then prefill 0.1 + 10 iters 0.1 -> tool 1.0 -> prefill 0.005 + 20 iters 0.2."""
    cfg = SimConfig(num_devices=2, steps=3, prompts_per_step=1, samples_per_prompt=1, max_staleness=1)
    sim = ClusterSim(cfg=cfg, cost=FakeCost(), workload=FakeWorkload([_spec()]), router=FakeRouter(), planner=None,
                     role_map=colocated_role_map(world_size=2, tp=1), lookahead=1, ctx_quantum=1, record=True)
    rows = sim.run()
    done = {r.spec.request_id: (r.admitted_at, r.finished_at) for r in sim.admitted}
    assert done["s1-a"][0] == 0.0  # admitted with step 0: one step ahead on the same ranks
    assert done["s2-a"] == pytest.approx((4.01, 4.01 + 2.0 + 0.5 + 0.1 + 0.1 + 0.1 + 1.0 + 0.005 + 0.2))
    assert max(r["staleness_max"] for r in rows) == 1


def test_same_inputs_same_metrics():
    a = _sim([_spec(rid=str(i), turns=(3 + i, 9)) for i in range(5)], steps=3).run()
    b = _sim([_spec(rid=str(i), turns=(3 + i, 9)) for i in range(5)], steps=3).run()
    assert a == b


class OnePlan:
    """Proposes `role_map` at the end of step `at` (a planner that knows what it wants)."""

    forecast_step_s = None  # it foresees nothing

    def __init__(self, role_map, at):
        self.role_map, self.at = role_map, at

    def on_step_end(self, stats, now):
        if stats.step != self.at:
            return None
        return PlanDecision(role_map=self.role_map, predicted_step_s=1.0, current_step_s=2.0, reconfig_s=3.0)

    def take_notes(self):
        return []


def _switch_at_step_2(spec):
    buckets = (Bucket(name="short", max_tokens=10**9), Bucket(name="long", max_tokens=None))
    cfg = SimConfig(num_devices=3, steps=3, prompts_per_step=1, samples_per_prompt=1)
    rm = split_role_map(world_size=3, num_trainer=1, rollout_tp=(("short", 1), ("long", 1)), buckets=buckets)
    new = split_role_map(world_size=3, num_trainer=2, rollout_tp=(("long", 1),), buckets=buckets, version=1)
    sim = ClusterSim(cfg=cfg, cost=FakeCost(), workload=FakeWorkload([spec]), router=LeastLoadRouter(),
                     planner=OnePlan(new, at=2), role_map=rm, lookahead=1, ctx_quantum=1, record=True)
    return sim, sim.run()


def test_a_switch_does_not_wait_for_the_tool_calls_of_the_requests_it_moves():
    # As in the runtime, a request in a tool call moves at once (its new instance re-issues the call, which
    # runs once): the switch at the end of step 2 costs the hand-off alone, and step 3's request, 10 s into a
    # 10 s tool call, re-prefills its whole context on the instance it moved to when the tool returns.
    sim, rows = _switch_at_step_2(_spec(latency=(10.0,)))
    assert rows[2]["reconfig_s"] == pytest.approx(3.0)
    step3_started = rows[0]["time_s"]  # step 3 is admitted when step 1 ends
    # prefill 100, 10 iterations, the tool; then the whole context (115) re-prefilled and 20 iterations
    assert rows[2]["trajectories"] == 1 and rows[2]["time_s"] > step3_started + 0.2 + 10.0 + 0.115 + 0.2


def test_a_switch_waits_for_the_scorings_of_the_requests_it_moves():
    # A request being scored cannot leave: the switch waits for step 3's scoring (10 s after its only turn).
    _, rows = _switch_at_step_2(_spec(turns=(10,), out=(), latency=(), score_s=10.0))
    step2_end, step3_started = rows[1]["time_s"], rows[0]["time_s"]
    scored_at = step3_started + 0.1 + 0.1 + 10.0  # prefill 100 tokens, 10 decode iterations, the scoring
    assert rows[2]["reconfig_s"] == pytest.approx(scored_at - step2_end + 3.0)


class OneCoreCost(FakeCost):
    shared_cores = 1  # a CPU profile: every rank shares this many cores


def test_on_shared_cores_two_busy_engines_each_run_at_half_speed():
    specs = [_spec(rid="a", turns=(10,), out=(), latency=()), _spec(rid="b", turns=(10,), out=(), latency=())]
    cfg = SimConfig(num_devices=3, steps=1, prompts_per_step=1, samples_per_prompt=2)
    rm = split_role_map(world_size=3, num_trainer=1, rollout_tp=(("short", 1), ("short", 1)),
                        buckets=(Bucket(name="short", max_tokens=None),))

    def rollout_s(cost):
        sim = ClusterSim(cfg=cfg, cost=cost, workload=FakeWorkload(specs), router=LeastLoadRouter(), planner=None,
                         role_map=rm, lookahead=1, ctx_quantum=1)
        return sim.run()[0]["rollout_s"]

    # each: prefill 100 tokens (0.1 s) + 10 decode iterations (0.1 s), on its own engine
    assert rollout_s(FakeCost()) == pytest.approx(0.2)
    assert rollout_s(OneCoreCost()) == pytest.approx(0.4)  # two busy ranks on one core


def test_a_group_is_one_prompt_of_one_step_named_as_the_coordinator_names_it():
    specs = [dataclasses.replace(_spec(rid=f"{p}{i}"), prompt_id=p) for p in ("a", "b") for i in range(2)]
    sim = _sim(specs)
    seen, admit = [], sim.core.admit
    sim.core.admit = lambda step, requests, now: (seen.extend(requests), admit(step, requests, now))[1]
    sim.run()
    assert {r.request_id: r.group_id for r in seen} == {"s0-a0": group_id(0, 0), "s0-a1": group_id(0, 0),
                                                        "s0-b0": group_id(0, 1), "s0-b1": group_id(0, 1)}
    assert group_id(0, 1) == "s0-p1"  # the coordinator's request ids extend it: s0-p1-n0, s0-p1-n1, ...


def test_an_instance_holds_the_kv_the_cost_model_prices():
    from scheduler.costmodel import get_cost_model

    cost = get_cost_model("a800", "qwen3-14b")
    cfg = SimConfig(num_devices=3, steps=1, prompts_per_step=1, samples_per_prompt=1)
    rm = split_role_map(world_size=3, num_trainer=1, rollout_tp=(("short", 1), ("long", 1)),
                        buckets=(Bucket(name="short", max_tokens=1000), Bucket(name="long", max_tokens=None)))
    sim = ClusterSim(cfg=cfg, cost=cost, workload=FakeWorkload([_spec()]), router=FakeRouter(), planner=None,
                     role_map=rm, lookahead=1)
    assert [i.kv_capacity_tokens for i in sim.instances.values()] == [cost.kv_capacity_tokens(1)] * 2


class HelpAll:
    """A planner that lets every idle instance it is offered help train, and plans nothing else."""

    forecast_step_s = None

    def on_step_end(self, stats, now):
        return None

    def take_notes(self):
        return []

    def elastic_helpers(self, num_tokens, role_map, candidates):
        return candidates


def test_idle_instances_help_train_and_the_row_says_how_many():
    cfg = SimConfig(num_devices=3, steps=2, prompts_per_step=1, samples_per_prompt=1, max_staleness=0)
    rm = split_role_map(world_size=3, num_trainer=1, rollout_tp=(("short", 1), ("long", 1)),
                        buckets=(Bucket(name="short", max_tokens=10**9), Bucket(name="long", max_tokens=None)))

    def rows(elastic):
        return ClusterSim(cfg=cfg, cost=FakeCost(), workload=FakeWorkload([_spec()]), router=FakeRouter(), planner=HelpAll(),
                          role_map=rm, lookahead=0, ctx_quantum=1, elastic=elastic).run()

    # each step: 1.405 rollout, then both (idle) instances help: the update takes 1.2 instead of 2.0, then 0.5 sync;
    # the helper that runs the next step is busy until the update ends, and takes it once the sync is over
    helped = rows(True)
    assert [r["time_s"] for r in helped] == pytest.approx([3.105, 6.21])
    assert [(r["train_s"], r["train/elastic_helpers"]) for r in helped] == [(1.2, 2), (1.2, 2)]
    alone = rows(False)
    assert [r["time_s"] for r in alone] == pytest.approx([3.905, 7.81]) and "train/elastic_helpers" not in alone[0]


def test_an_idle_instance_busy_helping_takes_requests_and_runs_them_once_it_is_done():
    inst = SimInstance(instance_id=0, tp=1, bucket="short", bucket_limit=None, capacity=8, cost=FakeCost())
    inst.stall(0.0, 1.2)  # computing gradients for the trainer until 1.2
    assert inst.busy and inst.next_event_time(0.0) is None
    inst.advance(0.5)
    inst.queue.append(SimRequest(_spec(turns=(10,), out=(), latency=()), 0, 0, 0.5, "g"))
    inst.fill()
    # the help left (0.7), the prompt's prefill (0.1), ten decode iterations (0.1)
    assert inst.next_event_time(0.5) == pytest.approx(1.4)
