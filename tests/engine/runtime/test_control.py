"""The control plane: every protocol message round-trips through a real store mailbox, in order and
exactly once; timeouts name what was awaited; heartbeats carry the role; ranks convert both ways."""

import dataclasses
import time

import pytest

from engine.runtime import protocol as msg
from engine.runtime.control import Heartbeat, Mailbox, host_store
from engine.rollout.api import Finished, MigrationState, Progress, ToolReturned
from engine.trajectory import Trajectory
from envs.base import Task, ToolCall, ToolInfraError
from scheduler.api import OutcomeState
from scheduler.layout import Bucket, split_role_map

TRAJ = Trajectory(request_id="r", task_id="t", group_id="g", prompt_len=1, token_ids=[5, 6], loss_mask=[0, 1],
                  logprobs=[0.0, -0.5], versions=[-1, 0], finish_reason="stop", reward=1.0)
STATE = MigrationState(request_id="r", prompt_len=1, token_ids=[5, 6], loss_mask=[0, 1], logprobs=[0.0, -0.5],
                       versions=[-1, 0], turns=[(1, 2)], tool_outcomes=[], tool_latency_s=[], turn_start=1, num_turns=1)
ROLE_MAP = split_role_map(world_size=3, num_trainer=1, rollout_tp=(("short", 1), ("long", 1)),
                          buckets=(Bucket(name="short", max_tokens=10), Bucket(name="long", max_tokens=None)))
TASK = Task(task_id="t", bench="toy", messages=({"role": "user", "content": "hi"},), tools=(), answer="x")

ONE_OF_EACH = [
    msg.Add("r", TASK, [1, 2, 3], "g"), msg.Add("r", TASK, [], "g", STATE), msg.Export("r"), msg.Cancel("r"),
    msg.EnvResult(7, True, "value"), msg.Train(0, [TRAJ], 3), msg.Sync(4), msg.Save("/tmp/x"),
    msg.ApplyRoleMap(ROLE_MAP, None), msg.ApplyRoleMap(ROLE_MAP, "/tmp/handoff"), msg.Stop(),
    msg.Ready(2, "rollout:2"),
    msg.Events(1, [ToolReturned("r", OutcomeState("bash", "small", "success"), 12), Progress("r", 20), Finished("r", TRAJ)]),
    msg.Exported("r", STATE), msg.ExportFailed("r", "waiting on a tool"),
    msg.EnvCall(3, "r", "execute", ToolCall(name="bash", arguments={"cmd": "ls"})), msg.EnvCall(-1, "r", "close", None),
    msg.EnvCall(4, "r", "execute", ToolCall(name="bash", arguments={"cmd": "ls"}), (3, 1)),
    msg.Trained(0, {"train/loss": 0.25}), msg.Synced(1, 4, 0.01), msg.Saved("/tmp/x"),
    msg.LogLine("12:00:00 [rank 2] [libra trainer:0] 2 trajectory(ies) cut"),
]


@pytest.fixture(scope="module")
def boxes():
    store = host_store(timeout_s=10)
    return Mailbox(store, 0, namespace="t"), Mailbox(store, 1, namespace="t"), Mailbox(store, 2, namespace="t")


def test_every_message_kind_is_covered():
    kinds = {type(m) for m in ONE_OF_EACH}
    assert kinds == set(msg.TO_WORKER) | set(msg.TO_COORDINATOR)
    assert set(msg.COLLECTIVE) <= set(msg.TO_WORKER)
    assert all(dataclasses.is_dataclass(k) and k.__dataclass_params__.frozen for k in kinds)


def test_every_message_round_trips_in_order_and_exactly_once(boxes):
    coord, worker, _ = boxes
    for m in ONE_OF_EACH:
        coord.send(1, m)
    got = worker.poll()
    assert [src for src, _ in got] == [0] * len(ONE_OF_EACH)
    assert [m for _, m in got] == ONE_OF_EACH
    assert worker.poll() == []


def test_an_exception_travels_as_an_env_result(boxes):
    coord, worker, _ = boxes
    coord.send(1, msg.EnvResult(1, False, ToolInfraError("sandbox gone")))
    (_, reply), = worker.poll()
    assert not reply.ok and isinstance(reply.value, ToolInfraError) and str(reply.value) == "sandbox gone"


def test_two_senders_keep_their_own_order(boxes):
    coord, w1, w2 = boxes
    for i in range(5):
        w1.send(0, msg.Synced(0, i, 0.0))
        w2.send(0, msg.Synced(1, i, 0.0))
    got = coord.poll()
    for src in (1, 2):
        assert [m.policy_version for s, m in got if s == src] == list(range(5))


def test_recv_timeout_names_what_it_waited_for(boxes):
    _, _, w2 = boxes
    with pytest.raises(TimeoutError, match=r"rank 2: no message from the coordinator within 0 s"):
        w2.recv(timeout_s=0.05, expect_from="the coordinator")


def test_heartbeat_carries_the_role(boxes):
    coord, w1, _ = boxes
    w1.beat("rollout:0 (instance 1, long TP1)")
    stamp, role = coord.last_beat_and_role(1)
    assert stamp > 0 and role == "rollout:0 (instance 1, long TP1)"
    assert coord.last_beat_and_role(5) is None


def test_worker_and_global_ranks_convert_both_ways():
    assert [msg.to_global(w) for w in range(3)] == [1, 2, 3]
    assert [msg.to_worker(msg.to_global(w)) for w in range(3)] == [0, 1, 2]
    with pytest.raises(AssertionError, match="is the coordinator"):
        msg.to_worker(msg.COORDINATOR)


def test_a_heartbeat_thread_beats_while_the_main_thread_is_busy_and_stops_when_told(boxes):
    coordinator, worker, _ = boxes
    role = ["trainer:0"]
    beat = Heartbeat(worker, lambda: role[0], every_s=0.05).start()
    first = coordinator.last_beat_and_role(1)
    time.sleep(0.3)  # the main thread "trains"
    role[0] = "rollout:0"
    time.sleep(0.2)
    later = coordinator.last_beat_and_role(1)
    assert later[0] > first[0] and later[1] == "rollout:0"
    beat.stop()
    stopped = coordinator.last_beat_and_role(1)
    time.sleep(0.2)
    assert coordinator.last_beat_and_role(1) == stopped
