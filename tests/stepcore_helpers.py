"""Fakes and drivers for the step core's tests (tests/steps/): a router that routes by prompt, a planner that records
what it is told, and helpers that admit and finish requests by hand."""

from scheduler.api import Decision, OutcomeState, Route
from scheduler.layout import Bucket, split_role_map
from steps.commands import CoreConfig, Finished, NewRequest
from steps.core import StepCore

BUCKETS = (Bucket(name="short", max_tokens=100), Bucket(name="long", max_tokens=None))
FAIL = OutcomeState("run_tests", "medium", "failure")


def layout(version=0, rollout=(("short", 1), ("long", 1)), num_trainer=1):
    return split_role_map(world_size=3, num_trainer=num_trainer, rollout_tp=rollout, buckets=BUCKETS, version=version)


class FakeRouter:
    """Admits to the first instance; a failing tool return moves the request to the last instance."""

    def __init__(self):
        self.where, self.finished, self.layouts = {}, [], []

    def set_layout(self, role_map, now):
        self.layouts.append(role_map.version)
        ids = [i.instance_id for i in role_map.instances]
        moved = {}
        for rid, iid in self.where.items():
            if iid not in ids:
                self.where[rid] = ids[0]
                moved[rid] = Route(ids[0], "short")
        self.ids = ids
        return moved

    def tree_json(self):
        return None  # learns nothing a checkpoint keeps

    def admit(self, rid, prompt_id, prompt_tokens, now):
        self.where[rid] = self.ids[0]
        return Route(self.ids[0], "short")

    def on_tool_return(self, rid, outcome, tokens, now):
        if outcome.status == "failure":
            self.where[rid] = self.ids[-1]
            return Decision("migrate", self.ids[-1], "long", "fail")
        return Decision("stay", self.where[rid], "short")

    def on_decode(self, rid, tokens, now):
        return Decision("stay", self.where[rid], "short")

    def on_finish(self, rid, tokens, now):
        self.finished.append(rid)
        self.where.pop(rid)

    def on_cancel(self, rid, now):
        self.where.pop(rid)


class FakePlanner:
    def __init__(self, plan=None):
        self.stats, self.plan = [], plan
        self.forecast_step_s = None  # after step k it foresees 10 * k seconds for the next one

    def on_step_end(self, stats, now):
        self.stats.append(stats)
        self.forecast_step_s = 10.0 * len(self.stats)
        plan, self.plan = self.plan, None
        return plan

    def take_notes(self):
        return [f"checked after step {len(self.stats)}"]


def make_core(*, steps=3, lookahead=1, max_staleness=1, planner=None, state=None):
    c = StepCore(CoreConfig(num_steps=steps, max_staleness=max_staleness, lookahead=lookahead), FakeRouter(), planner,
                 layout(), state=state)
    c.start(0.0)
    return c


def admit(c, now=0.0, n=2):
    s = c.next_admissible()
    return c.admit(s, [NewRequest(request_id=f"s{s}-{i}", group_id=f"s{s}", prompt_id=f"task{s}", prompt_tokens=10)
                       for i in range(n)], now)


def admit_groups(c, now, groups=2):
    """The next step as `groups` GRPO groups of two (finish-order batches take whole groups)."""
    s = c.next_admissible()
    return c.admit(s, [NewRequest(request_id=f"s{s}-g{g}-{i}", group_id=f"s{s}-g{g}", prompt_id=f"t{s}{g}",
                                  prompt_tokens=10) for g in range(groups) for i in range(2)], now)


def finish(c, rid, now, *, version=0, tokens=50, infra=False, signal=None, reason="", reward=1.0):
    c.on_finished(rid, Finished(num_tokens=tokens, num_model_tokens=tokens - 10, tool_latency_s=(0.5,),
                                signal_tokens=tokens - 20 if signal is None else signal,
                                first_version=version, reward=reward, reward_reason=reason, infra_failed=infra,
                                payload=rid), now)
