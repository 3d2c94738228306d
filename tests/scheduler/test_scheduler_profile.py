"""scheduler/profile.py: a measured profile round-trips through JSON, the profiled cost model
returns the measured times at measured points and is monotone between them, bad profiles are
refused with the command that writes one, and the planner's payback rule uses the measured
reconfiguration time (a switch the remaining steps cannot pay back is refused); on shared cores a stage
runs at its share of them, as measured, and the split is priced as the real runs measured it."""

import dataclasses
import json
import random
from pathlib import Path

import pytest

from scheduler.api import StepStats
from scheduler.layout import Bucket, BucketsConfig, split_role_map
from scheduler.layout_model import LayoutModel, Scales
from scheduler.planner import GlobalPlanner, PlannerConfig, Workload
from scheduler.profile import HardwareProfile, ProfiledCostModel, load_cost_model

DECODE = tuple((b, c, 0.002 * (1 + b / 8) * (1 + c / 1024)) for b in (1, 4, 16, 32) for c in (128, 512, 1536))


def profile(**kw) -> HardwareProfile:
    base = dict(model="tiny", arch="tiny", device="cpu", hardware="cpu", decode=DECODE,
                prefill=((64, 0.01), (256, 0.03), (1024, 0.2)), train_tokens_per_s={1: 1000.0, 2: 1800.0},
                sync_s=0.05, group_rebuild_s=0.1, reconfig_s=2.0, step_overhead_s=0.01, gather_s={1: 0.001, 2: 0.021},
                meta={"host": "test"})
    return HardwareProfile(**{**base, **kw})


def test_a_profile_round_trips_through_json(tmp_path):
    path = profile().save(tmp_path / "p.json")
    assert HardwareProfile.load(path) == profile()
    assert isinstance(load_cost_model(path), ProfiledCostModel)


def test_a_profile_of_a_model_outside_the_tables_carries_its_spec(tmp_path):
    spec = dict(name="my-finetune", num_params=1.3e6, num_active_params=1.3e6, num_layers=2, hidden=256, num_kv_heads=2,
                head_dim=64, bytes_per_param=4, num_heads=4)
    path = profile(model="/ckpt/my-finetune", arch="my-finetune", spec=spec).save(tmp_path / "p.json")
    cm = load_cost_model(path)
    assert cm.model.name == "my-finetune" and cm.model.num_params == 1.3e6
    with pytest.raises(ValueError, match="arch 'my-finetune' / hardware 'cpu' not in the cost model tables"):
        profile(arch="my-finetune")  # no spec: nothing to size it by


def test_measured_points_come_back_exactly_and_between_them_times_are_monotone():
    cm = ProfiledCostModel(profile())
    for b, c, t in DECODE:
        assert cm.decode_step_s(b, c, 1) == pytest.approx(t)
    assert cm.prefill_s(256, 1) == pytest.approx(0.03) and cm.train_s(1800, 2) == pytest.approx(1.0)
    by_batch = [cm.decode_step_s(b, 700, 1) for b in range(1, 33)]
    by_ctx = [cm.decode_step_s(8, c, 1) for c in range(128, 1537, 64)]
    assert all(a <= b for a, b in zip(by_batch, by_batch[1:])) and all(a <= b for a, b in zip(by_ctx, by_ctx[1:]))
    assert cm.decode_step_s(64, 3000, 1) > cm.decode_step_s(32, 1536, 1)  # linear past the grid, never flat
    assert cm.sync_s(3) == pytest.approx(0.051) and cm.reconfig_s(0) == 0.0 and cm.reconfig_s(2) == 2.0 and cm.step_overhead_s == 0.01
    assert cm.reconfig_s(2, trainer_moved=False) == pytest.approx(0.1 + 0.05)  # no hand-off: the rebuild and a sync


def test_unmeasured_trainer_sizes_follow_the_measured_scaling():
    cm = ProfiledCostModel(profile())
    t1, t2, t3 = (cm.train_s(10_000, n) for n in (1, 2, 3))
    assert t1 > t2 > t3 and t2 / t3 < 1.5  # 1 -> 2 ranks scaled 1.8x, so 2 -> 3 scales sub-linearly
    flat = ProfiledCostModel(profile(train_tokens_per_s={1: 1000.0, 2: 950.0}))  # FSDP over CPU ranks: slower
    assert flat.train_s(10_000, 3) > flat.train_s(10_000, 1)


@pytest.mark.parametrize("field,value,msg", [
    ("decode", (), "decode is empty"), ("sync_s", -1.0, "positive finite"), ("sync_s", float("nan"), "positive finite"),
    ("arch", "gpt-9", "not in the cost model tables"),
])
def test_a_bad_profile_is_refused_with_the_command_that_writes_one(field, value, msg):
    with pytest.raises(ValueError, match=msg + r".*python -m bench.profile"):
        profile(**{field: value})


def test_missing_fields_and_broken_files_name_the_problem(tmp_path):
    d = profile().to_dict()
    del d["sync_s"]
    (tmp_path / "a.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="lacks the field 'sync_s'"):
        HardwareProfile.load(tmp_path / "a.json")
    (tmp_path / "b.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        HardwareProfile.load(tmp_path / "b.json")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        HardwareProfile.load(tmp_path / "c.json")
    with pytest.raises(ValueError, match="profile '/no/such.json' does not exist"):
        PlannerConfig(profile="/no/such.json")


def _heavy_training_planner(reconfig_s: float, remaining_steps: int, tool_latency_s: tuple[float, ...] = ()):
    rng = random.Random(0)
    lens = tuple(min(1500, int(100 * rng.paretovariate(1.5))) for _ in range(64))
    cm = ProfiledCostModel(profile(train_tokens_per_s={1: 1000.0, 2: 2000.0, 3: 3000.0}, reconfig_s=reconfig_s))
    buckets = BucketsConfig(max_tokens=(1024, 1536))
    cfg = PlannerConfig(interval_steps=1, min_history_trajectories=1, settle_steps=0, min_gain_ratio=0.0, check_memory=False)
    p = GlobalPlanner(cfg, cm, 4, remaining_steps, buckets=buckets)
    first = p.plan(Workload(trajectory_tokens=lens, num_trajectories=64, train_tokens=1e3))
    stats = StepStats(step=1, rollout_s=1.0, train_s=cm.train_s(200_000, len(first.role_map.trainer_ranks)),
                      trajectory_tokens=lens, train_tokens=200_000, role_map=first.role_map, tool_latency_s=tool_latency_s)
    return first, p.on_step_end(stats, 1.0)


def test_the_planner_moves_ranks_only_when_the_measured_reconfiguration_pays_back():
    first, cheap = _heavy_training_planner(reconfig_s=1.0, remaining_steps=10)
    assert cheap is not None and len(cheap.role_map.trainer_ranks) > len(first.role_map.trainer_ranks)
    assert cheap.reconfig_s == 1.0  # the measured cost, not the analytic one
    gain = cheap.current_step_s - cheap.predicted_step_s
    assert gain * 10 > cheap.reconfig_s
    _, dear = _heavy_training_planner(reconfig_s=gain * 10 * 1.5, remaining_steps=10)
    assert dear is None  # the same move, but 10 steps cannot win back the measured switch
    _, late = _heavy_training_planner(reconfig_s=1.0, remaining_steps=0)
    assert late is None


def test_a_sync_starts_with_the_trainers_gather_and_a_colocated_one_does_not_broadcast():
    cm = ProfiledCostModel(profile())
    assert cm.sync_s(3, 2) == pytest.approx(0.021 + 0.05)  # gather over 2 FSDP ranks, then the broadcast
    assert cm.sync_s(4, 4, colocated=True) == pytest.approx(0.061)  # 4 ranks: linear past the measured 1..2
    assert cm.sync_s(0, 2) == 0.0
    assert ProfiledCostModel(profile(gather_s={})).sync_s(3, 4) == 0.05  # an older profile: the gather is not known


def test_a_switch_is_not_charged_for_tool_calls_in_flight():
    # A request in a tool call moves at once and its new instance re-issues the call (run once): a switch
    # costs the hand-off, however long the tools take (it once waited for the longest tool call seen).
    _, cheap = _heavy_training_planner(reconfig_s=1.0, remaining_steps=10, tool_latency_s=(0.5, 3.0, 1.0))
    assert cheap is not None and cheap.reconfig_s == pytest.approx(1.0)
    gain = cheap.current_step_s - cheap.predicted_step_s
    _, slow_tools = _heavy_training_planner(reconfig_s=1.0, remaining_steps=10, tool_latency_s=(gain * 10,))
    assert slow_tools is not None and slow_tools.role_map == cheap.role_map and slow_tools.reconfig_s == pytest.approx(1.0)


def test_a_hand_off_beside_busy_ranks_on_shared_cores_takes_longer():
    # The profile times the hand-off on two ranks alone; in a run the other ranks keep decoding on
    # the same cores (smollm2 on 2 cores: 34 s in the run against 13 s alone).
    cm = ProfiledCostModel(profile(cores=2))
    assert cm.reconfig_s(1, busy_ranks=2) == 2.0 and cm.reconfig_s(1, busy_ranks=4) == pytest.approx(4.0)
    assert cm.reconfig_s(1, trainer_moved=False, busy_ranks=4) == pytest.approx(0.15)  # no hand-off to slow down
    assert ProfiledCostModel(profile()).reconfig_s(1, busy_ranks=8) == 2.0  # cores unknown: as measured


def test_on_shared_cores_a_stage_runs_at_its_share_of_the_cores_as_measured():
    # bench.trainer beside busy processes on 2 cores (SmolLM2, 2026-12-07): two FSDP ranks trained at 1.32x one
    # alone, 0.86x beside one busy process and 1.01x beside two
    cm = ProfiledCostModel(profile(cores=2, train_tokens_per_s={1: 100.0, 2: 132.0}))

    def speed(ranks: int, beside: int) -> float:  # the rollout busy the whole time the trainer trains
        _, train = cm.on_shared_cores(1e9, cm.train_s(1000, ranks), num_rollout=beside, num_trainer=ranks, overlap=True)
        return 1000 / train

    assert speed(2, 0) / speed(1, 0) == pytest.approx(1.32)
    assert speed(2, 1) / speed(1, 1) == pytest.approx(0.88)  # measured 0.86: a second rank now costs
    assert speed(2, 2) / speed(1, 2) == pytest.approx(0.99)  # measured 1.01
    # stages that alternate (colocated, on-policy) share the cores among their own ranks only
    # (4 trainer ranks extrapolated from 1..2, each as if on a core of its own: on 2 cores half of one each)
    assert cm.on_shared_cores(10.0, 5.0, num_rollout=4, num_trainer=4, overlap=False) == pytest.approx((20.0, 10.0))
    assert ProfiledCostModel(profile()).on_shared_cores(10.0, 5.0, num_rollout=4, num_trainer=4, overlap=True) == (10.0, 5.0)


def test_on_shared_cores_the_split_is_priced_as_the_real_runs_measured_it():
    # smollm2-cpu-profile.json: what `bench.convergence --model smollm2` measured on 2 cores before its runs of
    # 2026-12-07 (two trainer ranks 1.39x one, each with a core to itself). On the digit task (32 trajectories of
    # ~27 tokens a step, 4 ranks) the split with one trainer rank stepped 15.3 s (partial-rollout, mean of 2 seeds,
    # steps 3-10) and with two 16.0 s (libra): the second rank takes its core from the rollout.
    wl = Workload(trajectory_tokens=tuple([20] * 8 + [25] * 8 + [28] * 8 + [34] * 8), num_trajectories=32, train_tokens=858)
    buckets = (Bucket(name="short", max_tokens=None),)

    def step_s(cores: int | None, num_trainer: int) -> float:
        prof = HardwareProfile.load(Path(__file__).with_name("smollm2-cpu-profile.json"))
        cm = ProfiledCostModel(prof if cores is None else dataclasses.replace(prof, cores=cores))
        rm = split_role_map(world_size=4, num_trainer=num_trainer, buckets=buckets,
                            rollout_tp=tuple(("short", 1) for _ in range(4 - num_trainer)))
        return LayoutModel(cm, buckets, max_batch=32, lookahead=1).predict(rm, wl, Scales())[0]

    # within 25%: the profile measured the trainer under a load of 2.7 (75 tokens/s on one rank; bench.trainer
    # on a quiet machine 100), so it prices the one-rank split 20% slow
    assert step_s(None, 1) == pytest.approx(15.3, rel=0.25) and step_s(None, 2) == pytest.approx(16.0, rel=0.25)
    assert step_s(0, 2) < 16.0 * 0.7  # priced as if each rank had a core: 10.8 s, and the planner moved for it


def test_on_a_cpu_the_planner_keeps_every_rank_within_the_host_memory():
    # a trainer rank's peak RSS is a fixed part plus the state FSDP shards (4 GB alone, 3 GB each of two: 2 GB
    # fixed, 2 GB sharded); every rollout rank 1 GB. The issue-34 main job put three SmolLM2 trainer ranks
    # and one rollout rank on a 24 GB machine (18.9 GB); a fourth trainer rank would not have fit.
    mem = dict(trainer_rss_bytes={1: 4e9, 2: 3e9}, rollout_rss_bytes=1e9)
    cm = ProfiledCostModel(profile(**mem, host_mem_bytes=16e9))
    assert cm.host_need_bytes(1, 3) == pytest.approx(7e9)
    assert cm.host_need_bytes(3, 1) == pytest.approx(3 * (2e9 + 2e9 / 3) + 1e9)
    assert cm.host_fits(3, 1) and not cm.host_fits(4, 4)  # colocated: each rank holds a shard and a rollout model
    assert ProfiledCostModel(profile(**mem)).host_fits(64, 64)  # the host's memory unknown: not checked
    assert HardwareProfile.from_dict(json.loads(json.dumps(profile(**mem, host_mem_bytes=16e9).to_dict()))) == \
        profile(**mem, host_mem_bytes=16e9)

    def trainer_ranks(host_mem_bytes: float) -> int:
        # training-heavy: every added trainer rank pays, so the planner takes as many as memory allows
        cm = ProfiledCostModel(profile(train_tokens_per_s={1: 1000.0, 2: 2000.0, 3: 3000.0}, host_mem_bytes=host_mem_bytes,
                                       trainer_rss_bytes={1: 4e9, 2: 3e9, 3: 2e9 + 2e9 / 3}, rollout_rss_bytes=1e9))
        p = GlobalPlanner(PlannerConfig(check_memory=True, allowed_tp=(1,)), cm, 4, 10, buckets=BucketsConfig())
        return len(p.plan(Workload(trajectory_tokens=(100,) * 16, num_trajectories=16, train_tokens=1e5)).role_map.trainer_ranks)

    assert trainer_ranks(0.0) == 3
    assert trainer_ranks(10e9) == 2  # three trainer ranks and a rollout rank need 9 GB: past 80% of 10 GB
    with pytest.raises(ValueError, match="within the host memory.*--nproc"):
        trainer_ranks(5e9)


def test_a_helpers_hand_off_costs_one_measured_sync_and_on_shared_cores_helpers_share_them():
    # bench.profile times the broadcast of num_params float32 values: a helper's gradient is as many bytes
    cm = ProfiledCostModel(HardwareProfile.load(Path(__file__).with_name("smollm2-cpu-profile.json")))
    sync_s, tokens = cm.profile.sync_s, 4096
    assert cm.grad_handoff_s(1, 1) == pytest.approx(sync_s)
    assert cm.elastic_train_s(tokens, 1, 0) == cm.train_s(tokens, 1)
    # two processes on the profile's two cores: each half at the speed it was measured at
    assert cm.elastic_train_s(tokens, 1, 1) == pytest.approx(cm.train_s(tokens / 2, 1) + sync_s)
    # four on two cores run at half speed: three helpers beside one trainer rank are no faster than one helper
    assert cm.elastic_train_s(tokens, 1, 3) == pytest.approx(2 * cm.train_s(tokens / 4, 1) + 3 * sync_s)
    assert cm.elastic_measured_busy(1, 3) == 4 and cm.elastic_measured_busy(2, 0) == cm.train_measured_busy(2)
