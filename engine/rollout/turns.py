"""The turn logic every rollout backend shares: many multi-turn trajectories at once, tool calls off the decode loop.

`TurnEngine` drives a `DecodeBackend` (engine/rollout/backend.py: the torch `BatchRunner` or the
vLLM `VllmRunner`), which owns the model, the KV and the sampling. One `step()`:
  1. Apply weights queued by `set_weights` (a version boundary between iterations; tokens record
     the version that sampled them). The backend may end running turns to do it (vLLM always,
     the torch engine only to recompute their KV); those rejoin first.
  2. Collect finished tool calls without blocking: record outcomes (`ToolReturned`), append
     the tool-response tokens (mask 0; tokenized on the tool thread, each call's output cut to
     `max_tool_tokens` and all of them to the trajectory's room left, with a note the model
     sees; engine/chat.py) and queue the sequence to re-join; a result with `done` (or a
     `ToolInfraError`) ends it. Collect finished scorings (`Finished`); a scoring that raised
     `ToolInfraError` finishes unscored as "tool_infra" (step() never raises).
  3. Join: ready requests (up to `max_batch` decoding) start their turn on the backend.
  4. Decode: one backend step. Every new token goes through `_advance` (token, mask, log-prob,
     policy version; the end of the turn: eos, `</tool_call>`, per-turn / total limits). A turn
     that ends with a tool call parks its KV and its calls run on the thread pool; otherwise the
     request is scored on the pool and its KV dropped. `Phase` (engine/rollout/api.py) is where
     each request is: READY -> RUNNING -> (TOOL -> READY ...) -> SCORING.
`export` takes a request in any phase but SCORING. One in a tool call leaves at once with its call: the
target instance re-issues the turn's calls, and an episode that outlives instances runs each call once
(`execute_once`), so a layout change never waits for a tool.

Invariants (tests/engine/rollout/, through both backends): a malformed tool call becomes a failure
result the model sees; every added request ends in exactly one of `Finished`, `export` or
`cancel`; trajectories satisfy `Trajectory.check()`; no tool output makes a trajectory longer
than `max_total_tokens`, and special-token text in it never becomes a special id.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import functools
import logging
import threading
import time
import zlib

import torch

from engine.chat import IM_END, TOOL_CALL_CLOSE, has_tool_call, parse_tool_calls, tool_response_encoder
from engine.rollout.api import Finished, MigrationState, Phase, Progress, RolloutConfig, RolloutRequest, ToolReturned
from engine.rollout.backend import DecodeBackend, Sampled
from engine.trajectory import Trajectory

__all__ = ["TurnEngine", "eos_ids", "tool_call_close_id"]

log = logging.getLogger(__name__)


def eos_ids(tokenizer, generation_config) -> set[int]:
    """The ids that end a model turn: the tokenizer's eos, `<|im_end|>` when it is one token, the model's eos ids."""
    ids = {tokenizer.eos_token_id}
    im_end = tokenizer.encode(IM_END, add_special_tokens=False)
    if len(im_end) == 1:
        ids.add(im_end[0])
    gen_eos = getattr(generation_config, "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return {i for i in ids if i is not None}


def tool_call_close_id(tokenizer) -> int | None:
    """The id of `</tool_call>` when it is one token (else the end of a call is found in the decoded text)."""
    close = tokenizer.encode(TOOL_CALL_CLOSE, add_special_tokens=False)
    return close[0] if len(close) == 1 else None


class _Seq:
    """One request in the engine: its state (`MigrationState`), its phase, its tool or scoring future."""

    def __init__(self, req: RolloutRequest, seed: int):
        self.req = req
        st = req.state
        if st is None:
            n = len(req.prompt_ids)
            st = MigrationState(request_id=req.request_id, prompt_len=n, token_ids=list(req.prompt_ids), loss_mask=[0] * n,
                                logprobs=[0.0] * n, versions=[-1] * n, turns=[], tool_outcomes=[], tool_latency_s=[],
                                turn_start=n, num_turns=1)
        self.st = st
        self.ids = st.token_ids
        self.phase = Phase.READY
        self.close_turn = True
        self.future: cf.Future | None = None
        self.timed_out = threading.Event()  # set when the engine stops waiting for this turn's tools
        self.started_s = 0.0
        self.last_progress = len(self.ids)
        self.final_text = ""
        self.finish_reason = ""
        self._seed = zlib.crc32(f"{seed}:{req.request_id}:{len(self.ids)}".encode())
        self._gen: torch.Generator | None = None

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def turn_start(self) -> int:
        return self.st.turn_start

    def generator(self, device: torch.device) -> torch.Generator:
        """The request's own sampling stream, seeded by (seed, request id, tokens when added); made at first use."""
        if self._gen is None:
            self._gen = torch.Generator(device=device).manual_seed(self._seed)
        return self._gen

    def append(self, token: int, mask: int, logprob: float, version: int) -> None:
        self.ids.append(token)
        self.st.loss_mask.append(mask)
        self.st.logprobs.append(logprob)
        self.st.versions.append(version)


def _run_tools(episode, calls, timed_out: threading.Event, render, turn: int):
    """Run a turn's calls in order; stop once the engine gave up waiting (its episode may be closing, or the
    request left with its tool call). Returns the (result, latency) pairs and the response's token ids
    (`render`; None when a result ends it).

    An episode that outlives its instance (the runtime's: the coordinator holds the env's) offers
    `execute_once(call, key)`: a call re-issued under the same (turn, index) key, by the instance a request
    moved to during its tool call, gets the first run's result; the tool never runs twice.

    Only `ToolInfraError` leaves: any other exception of the env is the call's failure result,
    which the model sees (a plug-in env whose `execute` raises must not end the rank)."""
    from envs.base import ToolInfraError, failure

    once = getattr(episode, "execute_once", None)
    results = []
    for i, call in enumerate(calls):
        if timed_out.is_set():
            break
        t0 = time.monotonic()
        try:
            res = once(call, (turn, i)) if once is not None else episode.execute(call)
        except ToolInfraError:
            raise
        except Exception as e:  # noqa: BLE001 - shown to the model, logged
            log.warning("[libra rollout] the env's execute raised %s: %s", type(e).__name__, str(e)[:200])
            res = failure(getattr(call, "name", "<parse>"), f"the tool raised {type(e).__name__}: {str(e)[:300]}")
        results.append((res, time.monotonic() - t0))
        if res.done:
            break
    # tokenized here, not on the decode loop: a huge output costs this thread, never the batch
    ids = None if timed_out.is_set() or any(res.done for res, _ in results) else render([res.text for res, _ in results])
    return results, ids


def _score_and_close(episode, final_text: str, score: bool):
    try:
        return episode.score(final_text) if score else None
    finally:
        episode.close()


class TurnEngine:
    """The turn logic over a `DecodeBackend` (`runner`); `RolloutEngine` and `VllmRolloutEngine` build one each."""

    def __init__(self, runner: DecodeBackend, tokenizer, cfg: RolloutConfig, *, policy_version: int = 0, instance_id: int = 0,
                 recompute_kv_on_update: bool = False, generation_config=None):
        # AReaL-style: a weight update interrupts in-flight requests and their KV is recomputed
        # with the new weights (re-prefill); the default keeps the old KV (partial rollout)
        self.recompute_kv_on_update = recompute_kv_on_update
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.policy_version = policy_version
        self.instance_id = instance_id
        self.runner = runner
        self.seqs: dict[str, _Seq] = {}
        self.ready: collections.deque[str] = collections.deque()
        self.pool = cf.ThreadPoolExecutor(cfg.tool_workers, thread_name_prefix="libra-tool") if runner.is_leader else None
        self._pending_weights: tuple[dict, int] | None = None
        self._pending_drops: list[str] = []
        self._leader_idle = True
        self.num_recomputed = 0  # requests whose KV a weight update made this engine recompute
        self.eos_ids = eos_ids(tokenizer, generation_config)
        self.tool_encoder = tool_response_encoder(tokenizer)
        self._close_call_id = tool_call_close_id(tokenizer)
        self._close_tail = len(tokenizer.encode(TOOL_CALL_CLOSE, add_special_tokens=False)) + 2

    # ---- API --------------------------------------------------------------------------------
    def add(self, req: RolloutRequest) -> None:
        """A new request, or one exported elsewhere: it decodes on from its state, or its tool call carries on here."""
        assert self.runner.is_leader, "only the TP leader takes requests"
        assert req.request_id not in self.seqs, f"request {req.request_id} added twice"
        seq = _Seq(req, self.cfg.seed)
        seq.st.instances.append(self.instance_id)
        self.seqs[req.request_id] = seq
        if seq.st.tool_call_s is None:
            self.ready.append(req.request_id)
            return
        st = seq.st
        seq.close_turn, elapsed_s, st.tool_call_s = st.close_turn, st.tool_call_s, None
        start, end = st.turns[-1]
        self._run_turn_tools(seq, self.tokenizer.decode(seq.ids[start:end], skip_special_tokens=False))
        seq.started_s -= elapsed_s  # its tool timeout counts from the call, not from the move

    def cancel(self, request_id: str) -> None:
        seq = self.seqs.pop(request_id)
        self._forget(seq)
        if seq.future is not None and not seq.future.done():
            seq.future.add_done_callback(lambda _f: seq.req.episode.close())
        elif seq.phase is not Phase.SCORING:
            self.pool.submit(seq.req.episode.close)

    def export(self, request_id: str) -> MigrationState:
        """The request's state, for another instance. One in a tool call leaves at once: this engine stops waiting
        for its tools (their results are the target's to collect, `_run_tools`). One being scored cannot leave."""
        seq = self.seqs[request_id]
        if seq.phase is Phase.SCORING:
            raise ValueError(f"request {request_id} is being scored; it finishes on instance {self.instance_id}")
        del self.seqs[request_id]
        self._forget(seq)
        if seq.phase is Phase.TOOL:
            seq.timed_out.set()
            seq.st.tool_call_s, seq.st.close_turn = time.monotonic() - seq.started_s, seq.close_turn
        return seq.st

    def set_weights(self, named_tensors: dict, policy_version: int) -> None:
        """Queue new weights; every rank of a TP group must call this before the same `step()`."""
        self._pending_weights = (named_tensors, policy_version)

    @property
    def num_running(self) -> int:
        return len(self.runner.rows)

    @property
    def idle(self) -> bool:
        return not self.seqs if self.runner.is_leader else self._leader_idle

    def wait_for_tools(self, timeout_s: float) -> None:
        """Block until a tool/scoring finishes or `timeout_s` passes (use when nothing decodes)."""
        futures = [s.future for s in self.seqs.values() if s.future is not None]
        if futures and not self.ready and not self.runner.rows:
            cf.wait(futures, timeout=timeout_s, return_when=cf.FIRST_COMPLETED)

    def offload(self) -> None:
        """Give the device memory to a colocated trainer (the backend's `offload`); `reload` undoes it.

        A time-shared hybrid rank trains with requests in flight: they lose their KV, the running ones
        rejoin first after the reload (re-prefilled, as after a KV-recomputing weight update) and the
        ones waiting on a tool re-prefill their whole context when it returns."""
        running = list(self.runner.rows) if self.runner.is_leader else []  # a TP follower only drops its KV
        self.runner.offload()
        for rid in reversed(running):
            self.seqs[rid].phase = Phase.READY
            self.ready.appendleft(rid)

    def reload(self) -> None:
        self.runner.reload()

    @property
    def offloaded(self) -> bool:
        return self.runner.offloaded

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        self.runner.close()

    def step(self) -> list:
        if self._pending_weights is not None:
            self._apply_weights(*self._pending_weights)
        if not self.runner.is_leader:
            self._leader_idle = self.runner.serve_step()
            return []
        if self._pending_drops:
            self.runner.drop(list(self._pending_drops))
            self._pending_drops.clear()
        events: list = []
        self._collect(events)
        self._join(events)
        if self.runner.rows:
            self._take(self.runner.step(), events)
        self.runner.end_step(idle=not self.seqs)
        return events

    # ---- internals ----------------------------------------------------------------------------
    def _apply_weights(self, named: dict, version: int) -> None:
        """Load queued weights; turns the backend ended for it rejoin first (re-prefilling on the new weights
        what their KV lacks), and count as recomputed when a weight update recomputes in-flight KV."""
        self._pending_weights = None
        interrupted = self.runner.update_weights(named, version, recompute_kv=self.recompute_kv_on_update)
        self.policy_version = version
        for rid in reversed(interrupted):
            self.seqs[rid].phase = Phase.READY
            self.ready.appendleft(rid)
        if self.recompute_kv_on_update:
            self.num_recomputed += len(interrupted)

    def _forget(self, seq: _Seq) -> None:
        rid = seq.req.request_id
        if rid in self.ready:
            self.ready.remove(rid)
        # dropped at the next step, so a TP leader never broadcasts outside the lockstep
        self._pending_drops.append(rid)

    def _collect(self, events: list) -> None:
        now = time.monotonic()
        for rid, seq in list(self.seqs.items()):
            if seq.future is None:
                continue
            if seq.phase is Phase.TOOL and not seq.future.done() and now - seq.started_s > self.cfg.tool_timeout_s:
                self._tool_timeout(seq, events)
            elif seq.future.done():
                fut, seq.future = seq.future, None
                if seq.phase is Phase.SCORING:
                    traj = self._trajectory(seq, self._reward(seq, fut))
                    traj.score_s = now - seq.started_s
                    events.append(Finished(rid, traj))
                    del self.seqs[rid]
                else:
                    self._tool_done(seq, fut, events)

    def _reward(self, seq: _Seq, fut: cf.Future):
        """The scoring's reward; None (dropped as "tool_infra", never scored 0) when the env's infrastructure
        failed; 0 with reason "score_error" when the env's score raised anything else on what the model made."""
        from envs.base import Reward, ToolInfraError

        try:
            return fut.result()
        except ToolInfraError as e:
            log.warning("[libra rollout:%d] %s: scoring infrastructure failed: %s", self.instance_id, seq.req.request_id, e)
            seq.finish_reason = "tool_infra"
            return None
        except Exception as e:  # noqa: BLE001 - a scored outcome, logged: never a dead rank
            log.warning("[libra rollout:%d] %s: the env's score raised %s: %s", self.instance_id, seq.req.request_id,
                        type(e).__name__, str(e)[:200])
            return Reward(0.0, "score_error")

    def _tool_timeout(self, seq: _Seq, events: list) -> None:
        from envs.base import ToolResult

        # the worker thread cannot be killed; it runs no further call of the turn, its late result is ignored
        seq.timed_out.set()
        seq.future = None
        res = ToolResult(tool="<timeout>", text=f"tool call timed out after {self.cfg.tool_timeout_s:.0f} s", status="timeout",
                         latency_s=self.cfg.tool_timeout_s)
        self._apply_results(seq, [(res, self.cfg.tool_timeout_s)], events)

    def _tool_done(self, seq: _Seq, fut: cf.Future, events: list) -> None:
        from envs.base import ToolInfraError

        try:
            results, ids = fut.result()
        except ToolInfraError as e:
            log.warning("[libra rollout:%d] %s: tool infrastructure failed: %s", self.instance_id, seq.req.request_id, e)
            self.runner.drop([seq.req.request_id])
            self._finish(seq, "tool_infra", score=False)
            return
        self._apply_results(seq, results, events, ids)

    def _render(self, seq: _Seq):
        """The turn's response encoder: cut to the room the trajectory has left now (its length does not
        change while its tools run) and to the per-call cap."""
        return functools.partial(self.tool_encoder.encode, close_turn=seq.close_turn,
                                 room=self.cfg.max_total_tokens - len(seq.ids), max_tokens_per_call=self.cfg.max_tool_tokens)

    def _apply_results(self, seq: _Seq, results, events: list, ids: list[int] | None = None) -> None:
        rid = seq.req.request_id
        for res, latency_s in results:
            seq.st.tool_outcomes.append(tuple(res.outcome()))
            seq.st.tool_latency_s.append(latency_s)
        if any(res.done for res, _ in results):
            outcome_events = [ToolReturned(rid, res.outcome(), len(seq.ids)) for res, _ in results]
            events.extend(outcome_events)
            self.runner.drop([rid])
            self._finish(seq, "submit")
            return
        if ids is None:  # a timeout's note, made on the loop (small)
            ids = self._render(seq)([res.text for res, _ in results])
        assert len(seq.ids) + len(ids) <= self.cfg.max_total_tokens, "a tool response was not cut to the room left"
        for tok in ids:
            seq.append(tok, 0, 0.0, -1)
        events.extend(ToolReturned(rid, res.outcome(), len(seq.ids)) for res, _ in results)
        if len(seq.ids) >= self.cfg.max_total_tokens:
            self.runner.drop([rid])
            self._finish(seq, "max_tokens")
            return
        seq.st.num_turns += 1
        seq.st.turn_start = len(seq.ids)
        seq.phase = Phase.READY
        self.ready.append(rid)

    def _join(self, events: list) -> None:
        room = self.cfg.max_batch - len(self.runner.rows)
        rids = [self.ready.popleft() for _ in range(min(room, len(self.ready)))]
        if not rids:
            return
        seqs = [self.seqs[r] for r in rids]
        for seq in seqs:
            seq.phase = Phase.RUNNING
        self._take(self.runner.join(seqs), events)

    def _take(self, outputs: list[Sampled], events: list) -> None:
        """Append each request's new tokens until its turn ends; then tell the backend which turns ended."""
        parked, finished = [], []
        for rid, tokens, logprobs, by_backend in outputs:
            seq = self.seqs[rid]
            ended = False
            for token, logprob in zip(tokens, logprobs):
                if not self._advance(seq, token, logprob, events):
                    ended = True
                    break
            assert ended or not by_backend, (f"the backend ended {rid}'s turn at {len(seq.ids)} tokens but the engine's limits "
                                             f"did not (turn start {seq.st.turn_start}, last token {seq.ids[-1]})")
            if ended:
                (parked if seq.phase is Phase.TOOL else finished).append(rid)
        self.runner.end_turns(parked, finished)

    def _advance(self, seq: _Seq, token: int, logprob: float, events: list) -> bool:
        """Append a sampled token; False when the turn ended (the caller removes the row)."""
        seq.append(token, 1, logprob, self.policy_version)
        rid = seq.req.request_id
        if len(seq.ids) - seq.last_progress >= self.cfg.progress_every_tokens:
            seq.last_progress = len(seq.ids)
            events.append(Progress(rid, len(seq.ids)))
        by_eos = token in self.eos_ids
        by_call = token == self._close_call_id if self._close_call_id is not None else (
            self.tokenizer.decode(seq.ids[-self._close_tail:], skip_special_tokens=False).endswith(TOOL_CALL_CLOSE))
        hit_total = len(seq.ids) >= self.cfg.max_total_tokens
        hit_turn = len(seq.ids) - seq.st.turn_start >= self.cfg.max_new_tokens_per_turn
        if not (by_eos or by_call or hit_total or hit_turn):
            return True
        self._end_turn(seq, by_eos, hit_total)
        return False

    def _end_turn(self, seq: _Seq, by_eos: bool, hit_total: bool) -> None:
        st = seq.st
        st.turns.append((st.turn_start, len(seq.ids)))
        text = self.tokenizer.decode(seq.ids[st.turn_start:], skip_special_tokens=False)
        seq.final_text = text.removesuffix(IM_END).removesuffix(self.tokenizer.eos_token or "")
        if has_tool_call(text) and not hit_total:
            if st.num_turns >= self.cfg.max_turns:
                self._finish(seq, "max_turns")
                return
            seq.close_turn = not by_eos
            self._run_turn_tools(seq, text)
            return
        self._finish(seq, "stop" if by_eos else "max_tokens")

    def _run_turn_tools(self, seq: _Seq, text: str) -> None:
        seq.phase = Phase.TOOL
        seq.started_s = time.monotonic()
        seq.timed_out = threading.Event()
        seq.future = self.pool.submit(_run_tools, seq.req.episode, parse_tool_calls(text), seq.timed_out, self._render(seq),
                                      seq.st.num_turns)

    def _finish(self, seq: _Seq, reason: str, *, score: bool = True) -> None:
        seq.finish_reason = reason
        seq.phase = Phase.SCORING
        seq.started_s = time.monotonic()
        seq.future = self.pool.submit(_score_and_close, seq.req.episode, seq.final_text, score)

    def _trajectory(self, seq: _Seq, reward) -> Trajectory:
        st = seq.st
        return Trajectory(
            request_id=st.request_id, task_id=seq.req.task.task_id if seq.req.task is not None else "",
            group_id=seq.req.group_id, prompt_len=st.prompt_len, token_ids=st.token_ids, loss_mask=st.loss_mask,
            logprobs=st.logprobs, versions=st.versions, turns=st.turns, tool_outcomes=st.tool_outcomes,
            tool_latency_s=st.tool_latency_s, reward=reward, finish_reason=seq.finish_reason, instances=st.instances,
            final_text=seq.final_text,
        ).check()
