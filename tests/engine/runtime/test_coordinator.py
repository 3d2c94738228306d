"""The coordinator constructed normally (a real store, real mailboxes, no processes): what it sends
for admission, migrations and env calls, and what it makes of the replies."""

import time
from dataclasses import dataclass

import pytest

from config import parse_args
from engine.runtime import protocol as msg
from engine.runtime.control import Mailbox, host_store
from engine.runtime.coordinator import Coordinator
from engine.devices import DeviceInfo
from engine.runtime.launch import RankContext
from engine.rollout.api import Finished, Progress, ToolReturned
from engine.trajectory import Trajectory
from envs.base import ToolCall, ToolInfraError
from envs.toy import ToyEnv
from scheduler.api import OutcomeState
from scheduler.systems import get_system, initial_role_map, make_router
from scheduler.layout import BucketsConfig

FAIL = OutcomeState("echo", "large", "failure")


class FakeTokenizer:
    chat_template = None  # no template of its own: the Hermes-style text is encoded

    def encode(self, text, add_special_tokens=False):
        return [1, 2, 3]

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


@dataclass
class Parts:
    env: object
    tasks: list
    tokenizer: object
    router: object
    planner: object
    spec: object
    design: object = None  # the system's own pipeline


def make(tmp_path, system="libra"):
    store = host_store(timeout_s=10)
    cfg = parse_args(["--model", "tiny", "--bench", "toy", "--system", system, "--steps", "2", "--nproc", "4",
                      "--launch.rank-timeout-s", "5"], device_kind_of=lambda d: "cpu")
    role_map = initial_role_map(system, 4, buckets=BucketsConfig(max_tokens=(20, 40)), trainer_frac=0.25)
    env = ToyEnv(seed=0, num_tasks=4)
    parts = Parts(env, env.tasks(), FakeTokenizer(), make_router(system, cfg.router), None, get_system(system))
    ctx = RankContext(rank=0, world_size=5, store=store, mailbox=Mailbox(store, 0), device_info=DeviceInfo("cpu", 2),
                      local_rank=0)
    coord = Coordinator(ctx, cfg, role_map, tmp_path, parts, resume=None)
    coord.core.start(0.0)
    workers = {w: Mailbox(store, msg.to_global(w)) for w in range(4)}
    return coord, workers


def drain(box):
    return [m for _, m in box.poll()]


def admitted(tmp_path):
    """A coordinator that admitted its first steps, with the Adds it sent drained from every worker's box."""
    coord, workers = make(tmp_path)
    coord.admit()
    for box in workers.values():
        drain(box)
    return coord, workers


def test_admission_sends_each_request_to_its_instance_leader(tmp_path):
    coord, workers = make(tmp_path)
    coord.admit()
    sent = {w: drain(box) for w, box in workers.items()}
    assert sent[0] == []  # worker 0 trains
    adds = [m for ms in sent.values() for m in ms]
    # toy CPU preset: 2 prompts x 2 samples per step, and lookahead 1 admits steps 0 and 1
    assert sorted(a.request_id for a in adds) == [f"s{s}-p{j}-n{i}" for s in (0, 1) for j in (0, 1) for i in (0, 1)]
    assert all(isinstance(a, msg.Add) and a.prompt_ids == [1, 2, 3] and a.state is None for a in adds)
    assert set(coord.episodes) == {a.request_id for a in adds}
    coord.pool.shutdown()


def test_a_migration_exports_then_re_adds_with_the_state_on_the_target(tmp_path):
    coord, workers = admitted(tmp_path)
    rid = "s0-p0-n0"
    src = coord.core.requests[rid].instance_id
    leader = coord.role_map.instance(src).ranks[0]
    coord._dispatch(msg.to_global(leader), msg.Events(src, [ToolReturned(rid, FAIL, 30), Progress(rid, 45)]))
    assert drain(workers[leader]) == [msg.Export(rid)]
    coord._dispatch(msg.to_global(leader), msg.Exported(rid, "STATE"))
    target = coord.core.requests[rid].instance_id
    assert target != src
    add, = drain(workers[coord.role_map.instance(target).ranks[0]])
    assert (add.request_id, add.state, add.prompt_ids) == (rid, "STATE", [])
    coord.pool.shutdown()


def test_a_finished_trajectory_counts_and_is_logged(tmp_path):
    coord, workers = make(tmp_path)
    coord.admit()
    traj = Trajectory(request_id="s0-p0-n0", task_id="t", group_id="s0-p0", prompt_len=3, token_ids=[1, 2, 3, 4],
                      loss_mask=[0, 0, 0, 1], logprobs=[0, 0, 0, -1.0], versions=[-1, -1, -1, 0], finish_reason="stop",
                      reward=1.0)
    coord._dispatch(2, msg.Events(0, [Progress("s0-p0-n0", 4), Finished("s0-p0-n0", traj)]))
    assert "s0-p0-n0" not in coord.core.requests and coord.core.steps[0].done["s0-p0-n0"].payload is traj
    assert '"request_id": "s0-p0-n0"' in (tmp_path / "trajectories.jsonl").read_text()
    coord.pool.shutdown()


def _replies(box, n: int, timeout_s: float = 30.0) -> dict:
    replies = {}
    deadline = time.monotonic() + timeout_s
    while len(replies) < n and time.monotonic() < deadline:
        replies.update({m.call_id: m for m in drain(box)})
    return replies


def test_env_calls_are_answered_from_the_pool_and_env_errors_are_scored_not_dropped(tmp_path):
    coord, workers = make(tmp_path)
    coord.admit()
    box = workers[1]
    drain(box)
    coord._dispatch(msg.to_global(1), msg.EnvCall(5, "s0-p0-n0", "execute", ToolCall(name="echo", arguments={"text": "hi"})))
    coord.episodes["s0-p0-n1"] = Exploding()
    coord._dispatch(msg.to_global(1), msg.EnvCall(6, "s0-p0-n1", "score", "final"))
    coord._dispatch(msg.to_global(1), msg.EnvCall(7, "s0-p0-n1", "execute", ToolCall(name="echo", arguments={})))
    coord.episodes["s1-p0-n0"] = Exploding(ToolInfraError("sandbox is gone"))
    coord._dispatch(msg.to_global(1), msg.EnvCall(8, "s1-p0-n0", "score", "final"))
    replies = _replies(box, 4)
    assert replies[5].ok and "hi" in replies[5].value.text
    # an env that raises on what the model made: a 0 with its reason, and a failure the model sees
    assert replies[6].ok and replies[6].value == 0.0 and replies[6].value.reason == "score_error"
    assert replies[7].ok and replies[7].value.status == "failure" and "ZeroDivisionError" in replies[7].value.text
    # only the host's own fault is an infra failure (the trajectory is dropped with that reason)
    assert not replies[8].ok and isinstance(replies[8].value, ToolInfraError)
    coord._dispatch(msg.to_global(1), msg.EnvCall(-1, "s0-p0-n0", "close", None))
    assert "s0-p0-n0" not in coord.episodes  # closed once, by the pool
    coord.pool.shutdown()


def test_a_late_call_for_a_closed_episode_is_answered_not_asserted(tmp_path):
    """A tool thread outlived its timeout, the episode was scored and closed, then the turn's second call came."""
    coord, workers = make(tmp_path)
    coord.admit()
    box = workers[1]
    drain(box)
    coord._dispatch(msg.to_global(1), msg.EnvCall(-1, "s0-p0-n0", "close", None))
    coord._dispatch(msg.to_global(1), msg.EnvCall(9, "s0-p0-n0", "execute", ToolCall(name="echo", arguments={"text": "late"})))
    coord._dispatch(msg.to_global(1), msg.EnvCall(-1, "s0-p0-n0", "close", None))  # a second close: ignored
    reply = _replies(box, 1)[9]
    assert not reply.ok and "episode is closed" in str(reply.value)
    coord.pool.shutdown()


class Counting:
    def __init__(self):
        self.calls = 0

    def execute(self, call):
        self.calls += 1
        time.sleep(0.2)
        return f"run {self.calls}"

    def close(self):
        pass


def test_a_tool_call_re_issued_by_the_instance_a_request_moved_to_runs_once(tmp_path):
    """A layout change exports a request in a tool call at once; its new instance re-issues the call under the
    same key and gets the first run's result (engine/runtime/once.py); the episode's close forgets the keys."""
    coord, workers = admitted(tmp_path)
    coord.episodes["s0-p0-n0"] = episode = Counting()
    call = ToolCall(name="echo", arguments={"text": "hi"})
    coord._dispatch(msg.to_global(1), msg.EnvCall(3, "s0-p0-n0", "execute", call, (2, 0)))
    coord._dispatch(msg.to_global(2), msg.EnvCall(0, "s0-p0-n0", "execute", call, (2, 0)))  # the same call, moved
    old, new = _replies(workers[1], 1), _replies(workers[2], 1)
    coord._dispatch(msg.to_global(2), msg.EnvCall(1, "s0-p0-n0", "execute", call, (2, 1)))  # the turn's next call
    new.update(_replies(workers[2], 1))
    assert old[3].value == new[0].value == "run 1" and new[1].value == "run 2" and episode.calls == 2
    coord._dispatch(msg.to_global(2), msg.EnvCall(-1, "s0-p0-n0", "close", None))
    deadline = time.monotonic() + 10
    while len(coord.tool_calls) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(coord.tool_calls) == 0
    coord.pool.shutdown()


def test_a_workers_remote_episode_sends_its_key_and_both_instances_get_one_run(tmp_path):
    """The worker's side: `RemoteEpisode.execute_once` on the instance a request left and on the one it moved to."""
    import concurrent.futures as cf

    from engine.runtime.worker import RemoteEpisode, ToolLink

    coord, workers = admitted(tmp_path)
    coord.episodes["s0-p0-n0"] = episode = Counting()
    links = {w: ToolLink(workers[w], timeout_s=20) for w in (1, 2)}
    call = ToolCall(name="echo", arguments={})
    with cf.ThreadPoolExecutor(2) as pool:
        results = [pool.submit(RemoteEpisode(links[w], "s0-p0-n0").execute_once, call, (1, 0)) for w in (1, 2)]
        deadline = time.monotonic() + 20
        while not all(r.done() for r in results) and time.monotonic() < deadline:
            coord.pump()
            for w, link in links.items():
                for _, m in workers[w].poll():
                    link.resolve(m.call_id, m.ok, m.value)
    assert [r.result() for r in results] == ["run 1", "run 1"] and episode.calls == 1
    coord.pool.shutdown()


# (model's boxed answer, gold, reward): what an RL run on math is trained on, graded on the coordinator's pool
MATH_EQUIVALENCE = [
    ("96.0", "96", 1.0), ("x = 96", "96", 1.0), ("96 \\text{ apples}", "96", 1.0), ("\\$96", "96", 1.0),
    ("47/15", "\\frac{47}{15}", 1.0), ("\\dfrac{47}{15}", "\\frac{47}{15}", 1.0), ("0.5", "\\frac{1}{2}", 1.0),
    ("\\frac{2}{4}", "\\frac{1}{2}", 1.0), ("[1,2)", "[1, 2)", 1.0), ("(1, 2]", "(1,2]", 1.0), ("\\sqrt{9}", "3", 1.0),
    ("97", "96", 0.0), ("96, 97", "96", 0.0), ("x", "96", 0.0), ("", "96", 0.0), ("}{junk", "4", 0.0),
    ("[1, 2]", "[1, 2)", 0.0), ("\\infty", "96", 0.0), ("9^{9^{9^{9}}}", "96", 0.0),
]


def test_math_answers_are_graded_right_through_the_coordinator(tmp_path):
    from envs.base import Task
    from envs.math.env import MathConfig, MathEnv

    coord, workers = make(tmp_path)
    env = MathEnv(seed=0, num_tasks=1, cfg=MathConfig(grade_timeout_s=3.0))
    box = workers[1]
    try:
        for i, (pred, gold, _) in enumerate(MATH_EQUIVALENCE):
            task = Task(task_id=f"m{i}", bench="math", messages=(), tools=(), answer={"answer": gold})
            coord.episodes[f"m{i}"] = env.start(task)
            coord._dispatch(msg.to_global(1), msg.EnvCall(100 + i, f"m{i}", "score", f"So \\boxed{{{pred}}}."))
        replies = _replies(box, len(MATH_EQUIVALENCE), timeout_s=120)
        got = [(pred, gold, replies[100 + i].value) for i, (pred, gold, _) in enumerate(MATH_EQUIVALENCE)]
        assert [(p, g, float(r)) for p, g, r in got] == MATH_EQUIVALENCE
        reasons = {r.reason for _, _, r in got}
        assert reasons <= {"correct", "wrong", "timeout"} and "timeout" in reasons  # the tower of powers
    finally:
        for ep in list(coord.episodes.values()):
            ep.close()
        env.close()
        coord.pool.shutdown()


def test_an_unexpected_message_names_its_sender(tmp_path):
    coord, _ = make(tmp_path)
    with pytest.raises(RuntimeError, match=r"coordinator: unexpected Train from rank 3"):
        coord._dispatch(3, msg.Train(0, [], 0))
    coord.pool.shutdown()


def test_wait_for_returns_the_typed_replies_and_keeps_the_others(tmp_path):
    coord, workers = make(tmp_path)
    workers[0].send(0, msg.Synced(0, 1, 0.1))
    workers[0].send(0, msg.Trained(3, {"train/loss": 0.5}))
    trained, = coord.wait_for(msg.Trained, 1, "the trainer")
    assert trained == msg.Trained(3, {"train/loss": 0.5})
    assert coord.replies == [msg.Synced(0, 1, 0.1)]
    with pytest.raises(RuntimeError, match=r"waited 5 s for the sync; got 1/2"):
        coord.wait_for(msg.Synced, 2, "the sync")
    coord.pool.shutdown()


class Exploding:
    def __init__(self, error: Exception | None = None):
        self.error = error

    def _raise(self):
        if self.error is not None:
            raise self.error
        return 1 / 0

    def score(self, final_text):
        return self._raise()

    def execute(self, call):
        return self._raise()

    def close(self):
        pass
