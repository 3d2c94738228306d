"""Coordinator event handling without processes: a Finished event is never lost to a migration."""

from types import SimpleNamespace

from engine.coordinator import Coordinator, _Req, _Step
from engine.ledger import Ledger
from engine.rollout_types import Finished, Progress
from engine.trajectory import Trajectory
from scheduler.api import Decision


class FakeRouter:
    def __init__(self):
        self.finished = []

    def on_decode(self, rid, tokens, now):
        return Decision("migrate", 7, "long", "demote")  # always wants to move it

    def on_finish(self, rid, tokens, now):
        self.finished.append(rid)


class FakeMailbox:
    def __init__(self):
        self.sent = []

    def send(self, dst, msg):
        self.sent.append((dst, msg))


class FakeWriter:
    def trajectory(self, row):
        pass


def make_coordinator():
    coord = object.__new__(Coordinator)
    coord.router, coord.mailbox, coord.writer, coord.ledger = FakeRouter(), FakeMailbox(), FakeWriter(), Ledger()
    coord.role_map = SimpleNamespace(instance=lambda iid: SimpleNamespace(ranks=(iid,)))
    coord.leaving, coord.parked, coord.t0 = set(), {}, 0.0
    coord._progress_t = 0.0
    coord.reqs = {"r": _Req("r", None, "g", 0, None, instance_id=1)}
    coord.steps = {0: _Step(index=0, admitted_s=0.0, rids=["r"])}
    coord.ledger.start("r", 0)
    return coord


def test_finished_after_a_migration_decision_in_the_same_batch_is_kept():
    coord = make_coordinator()
    traj = Trajectory(request_id="r", task_id="t", group_id="g", prompt_len=1, token_ids=[1, 2], loss_mask=[0, 1],
                      logprobs=[0.0, -1.0], versions=[-1, 0], finish_reason="stop", reward=1.0)
    coord._on_events(2, 1, [Progress("r", 100), Finished("r", traj)])
    assert coord.mailbox.sent == [(2, ("export", "r"))]  # the migration was asked for...
    assert coord.steps[0].complete and coord.steps[0].done["r"] is traj  # ...and the result still counts
    assert coord.router.finished == ["r"] and "r" not in coord.reqs
    coord._on_export_failed(2, "r", "finished meanwhile")  # the late failure is harmless
