"""What several rollout tests share: a scripted episode, the token script that makes the tiny model call a
tool on cue, and a driver that runs an engine to idle with cancels and migrations on the way."""

import concurrent.futures as cf
import time

from engine.rollout.api import Phase
from engine.rollout.engine import Finished, RolloutRequest, ToolReturned
from engine.runtime.once import CallOnce
from envs.base import Task, ToolCallError, ToolInfraError, ToolResult
from envs.toolcalls import CALL_CLOSE, CALL_OPEN, format_tool_call

CALL = format_tool_call("calc", {"x": 1}, template=True)
BAD_CALL = f"{CALL_OPEN}\n{{bad json\n{CALL_CLOSE}"


class FakeEpisode:
    def __init__(self, latency_s=0.0, infra_at=None, score_infra=False):
        self.latency_s, self.infra_at, self.calls, self.closed = latency_s, infra_at, [], False
        self.score_infra = score_infra

    def execute(self, call):
        self.calls.append(call)
        time.sleep(self.latency_s)
        if self.infra_at == len(self.calls):
            raise ToolInfraError("sandbox gone")
        if isinstance(call, ToolCallError):
            return ToolResult(tool="<parse>", text="error: " + call.message[:20], status="failure")
        return ToolResult(tool=call.name, text=f"ok {len(self.calls)}", status="success")

    def score(self, final_text):
        if self.score_infra:
            raise ToolInfraError("grading sandbox could not start")
        return float(len(self.calls))

    def close(self):
        self.closed = True


class OnceEpisode(FakeEpisode):
    """An episode shared by two engines, as the coordinator's are: a call re-issued under its key runs once."""

    def __init__(self, latency_s=0.0):
        super().__init__(latency_s)
        self.once = CallOnce()

    def execute_once(self, call, key):
        out = cf.Future()
        self.once.run("r", key, lambda: self.execute(call), out.set_result)
        return out.result()


def make_script(tok):
    call, bad = tok.encode(CALL, add_special_tokens=False), tok.encode(BAD_CALL, add_special_tokens=False)
    script = {40 + i: t for i, t in enumerate(call)}
    script.update({95 + i: t for i, t in enumerate(bad)})
    script[140] = tok.eos_token_id
    return script


def task_for(i):
    return Task(task_id=f"t{i}", bench="toy", messages=({"role": "user", "content": "go " * (i % 9)},), tools=())


def run(engine, reqs, *, cancel=(), migrate_to=None, migrate=(), migrate_in_tool=(), max_steps=3000):
    """Drive `engine` to idle; cancels/exports the named requests after their first ToolReturned, or (`migrate_in_tool`)
    as soon as their first tool call runs."""
    for r in reqs:
        engine.add(r)
    done, seen = {}, []
    engines = [engine] + ([migrate_to] if migrate_to else [])
    for _ in range(max_steps):
        if all(e.idle for e in engines):
            break
        for e in engines:
            for ev in e.step():
                seen.append(ev)
                if isinstance(ev, Finished):
                    done[ev.request_id] = ev.trajectory
                elif isinstance(ev, ToolReturned) and ev.request_id in cancel and ev.request_id in e.seqs:
                    e.cancel(ev.request_id)
                elif isinstance(ev, ToolReturned) and ev.request_id in migrate and e is engine and ev.request_id in e.seqs:
                    state = e.export(ev.request_id)
                    req = next(r for r in reqs if r.request_id == ev.request_id)
                    migrate_to.add(RolloutRequest(req.request_id, req.task, req.episode, req.prompt_ids, req.group_id, state=state))
        for rid in [r for r in migrate_in_tool if r in engine.seqs and engine.seqs[r].phase is Phase.TOOL]:
            state = engine.export(rid)
            req = next(r for r in reqs if r.request_id == rid)
            migrate_to.add(RolloutRequest(rid, req.task, req.episode, req.prompt_ids, req.group_id, state=state))
            migrate_in_tool = set(migrate_in_tool) - {rid}
        time.sleep(0.0005)
    assert all(e.idle for e in engines)
    return done, seen
