"""Rollout engine vs `model.generate` on one multi-turn workload with tool pauses.

Workload: N trajectories (default 32), up to 3 model turns each (two tool calls), tool latencies
drawn per (request, call) from a seeded uniform distribution and, one call in ten, a large tool
payload that pushes the trajectory into long turns (the long tail). Both systems see the same
latencies and payloads. The policy is the tiny random model (or `--model smollm2`) with a
position-keyed logit bias that writes the tool calls on cue, so under greedy decoding both
systems produce the same trajectories (the table shows equal token counts).

Both systems get the same KV budget: `--max-batch` sequences decoding at once (default 8).
Baseline: waves of `max-batch` trajectories; per turn one batched `generate` over the wave's live
trajectories (left padded, stopping at `<|im_end|>` or `</tool_call>`), then all tool calls on a
thread pool, waiting for the slowest, then the next turn re-prefills everything. The engine
refills a slot as soon as a sequence pauses for a tool or ends, overlaps tools with decoding,
and prefills only new tokens. Speeds on shared CPUs swing a lot: the two alternate for
`--rounds` rounds and each keeps its best wall time; the forward counts are noise-free.

Where vLLM is installed (`LIBRA_VLLM=1 bash run.sh`), a third row runs the same workload on the vLLM
backend (engine/rollout/vllm_engine.py, the script as a vLLM logits processor; its "forwards" are engine
steps, its prefix cache is emptied before each round; `--no-vllm` leaves it out), and a fourth,
`raw-vllm`, runs it on the same vLLM engine driven directly (`run_raw_vllm`: no Libra bookkeeping),
so that the backend's overhead shows. A model vLLM cannot run (the tiny one: head_dim 16 on CPU)
gets a line saying why instead.

Prints a table, `vllm_vs_raw_vllm: O` and `vllm_vs_engine: V` when vLLM ran, and, last,
`rollout_vs_generate: R` (engine model tokens/s over generate's).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import random
import time
from pathlib import Path

import torch

from engine.chat import TOOL_CALL_CLOSE, has_tool_call, render_tool_response
from engine.models import load_policy, render_prompt
from engine.rollout.engine import Finished, RolloutConfig, RolloutEngine, RolloutRequest
from engine.rollout.engine import eos_ids as turn_end_ids
from envs.base import Task, ToolResult

DENSE_TOKENS = 300
LONG_TURN_TOKENS = 200
CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": 7}}\n</tool_call>'


def bias_policy(model, script: dict[int, int], banned: list[int], bias: float = 30.0):
    """Patch `model.forward`: add `bias` to script[pos] at scripted positions, ban stop tokens elsewhere."""
    size = max(script) + 2
    table = torch.full((size,), -1, dtype=torch.long)
    for pos, tok in script.items():
        table[pos] = tok
    inner = model.forward
    model.num_forwards = 0

    def forward(*args, input_ids=None, attention_mask=None, position_ids=None, **kw):
        model.num_forwards += 1
        out = inner(*args, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kw)
        pos = position_ids if position_ids is not None else (attention_mask.cumsum(-1) - 1)[:, -input_ids.shape[1]:]
        pos = pos[:, -out.logits.shape[1]:] + 1
        want = table[pos.clamp(max=size - 1)]
        out.logits[..., banned] -= bias
        hit = want >= 0
        out.logits[hit] = out.logits[hit].scatter_add(-1, want[hit][:, None], torch.full((int(hit.sum()), 1), 2 * bias))
        return out

    model.forward = forward
    return model


class Episode:
    def __init__(self, rid: str, max_latency_s: float, seed: int):
        self.rng = random.Random(f"{seed}:{rid}")
        self.max_latency_s = max_latency_s

    def execute(self, call):
        time.sleep(self.rng.uniform(0, self.max_latency_s))
        # one call in ten returns a large payload: the trajectory then lands among the long turns
        repeats = self.rng.randint(80, 120) if self.rng.random() < 0.1 else self.rng.randint(1, 8)
        return ToolResult(tool=getattr(call, "name", "<parse>"), text="value: " + "42 " * repeats, status="success")

    def score(self, final_text):
        return 1.0

    def close(self):
        pass


def workload(tok, n: int, seed: int):
    """Tasks, prompts and the script: the positions where a tool call is written.

    Calls are dense (every 4-24 tokens) over the first `DENSE_TOKENS` positions and every
    `LONG_TURN_TOKENS` after, so a trajectory stays short unless a large tool payload pushes it
    past the dense region: the tool outcome causes the long tail, as in Libra's C-MLFQ premise.
    """
    rng = random.Random(seed)
    tasks = [Task(task_id=f"t{i}", bench="toy", messages=({"role": "user", "content": "look up key " + "7 " * (i % 16)},), tools=())
             for i in range(n)]
    prompts = [render_prompt(tok, t.messages, ()) for t in tasks]
    call = tok.encode(CALL, add_special_tokens=False)
    script, pos = {}, max(map(len, prompts)) + 4
    while pos < 4000:
        script.update({pos + i: t for i, t in enumerate(call)})
        pos += len(call) + (rng.randint(4, 24) if pos < DENSE_TOKENS else LONG_TURN_TOKENS)
    return tasks, prompts, script


def _cfg(args) -> RolloutConfig:
    return RolloutConfig(temperature=0.0, max_new_tokens_per_turn=args.max_new_tokens, max_turns=3, max_total_tokens=4096,
                         max_batch=args.max_batch, tool_workers=args.num_trajectories)


def run_engine(model, tok, tasks, prompts, args) -> tuple[int, float]:
    engine = RolloutEngine(model, tok, _cfg(args))
    t0 = time.perf_counter()
    for task, ids in zip(tasks, prompts):
        engine.add(RolloutRequest(task.task_id, task, Episode(task.task_id, args.max_latency_s, args.seed), ids, "g"))
    tokens, model.num_forwards = 0, 0
    while not engine.idle:
        tokens += sum(e.trajectory.num_model_tokens for e in engine.step() if isinstance(e, Finished))
        engine.wait_for_tools(0.05)
    engine.close()
    return tokens, time.perf_counter() - t0, model.num_forwards


def vllm_engine(model, tok, script, banned, args):
    """A vLLM backend engine over `model`'s weights with the same script, or (None, why not)."""
    import importlib.util
    import tempfile

    if args.no_vllm or importlib.util.find_spec("vllm") is None:
        return None, "not installed (LIBRA_VLLM=1 bash run.sh)" if not args.no_vllm else "--no-vllm"
    from engine.models import save_policy_dir
    from engine.rollout.vllm_engine import VllmRolloutEngine
    from engine.rollout.vllm_script import ScriptLogits

    with tempfile.TemporaryDirectory(prefix="libra-bench-") as tmp:  # vLLM reads the weights at start-up only
        path = save_policy_dir(model, tok, Path(tmp) / "policy")
        try:
            eng = VllmRolloutEngine(path, tok, _cfg(args), kv_cache_mb=1024, engine_kwargs={"logits_processors": [ScriptLogits]},
                                    sampling_extra_args={"libra_script": script, "libra_bias": 60.0, "libra_ban": 30.0,
                                                         "libra_banned": banned})
        except ValueError as exc:
            return None, str(exc)
    return eng, ""


def run_vllm(eng, tasks, prompts, args) -> tuple[int, float, int]:
    eng.llm.reset_prefix_cache()  # every round prefills its prompts, as the other two systems do
    t0, tokens, steps = time.perf_counter(), 0, 0
    for task, ids in zip(tasks, prompts):
        eng.add(RolloutRequest(task.task_id, task, Episode(task.task_id, args.max_latency_s, args.seed), ids, "g"))
    while not eng.idle:
        steps += bool(eng.num_running)
        tokens += sum(e.trajectory.num_model_tokens for e in eng.step() if isinstance(e, Finished))
        eng.wait_for_tools(0.05)
    return tokens, time.perf_counter() - t0, steps


def run_raw_vllm(eng, tok, tasks, prompts, args) -> tuple[int, float, int]:
    """The same workload on the same vLLM engine (weights, script, KV) driven directly, as a vLLM user would
    write it: every trajectory submitted at once (vLLM's scheduler holds `max_batch` running), a turn that holds
    a tool call runs it on a thread pool and comes back as a new request over its whole context (prefix cache
    on), sampled log-probs asked for (an RL rollout needs them). No Libra bookkeeping: what the backend adds on
    top of this is its overhead."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    llm = eng.llm
    llm.reset_prefix_cache()
    close = tok.encode(TOOL_CALL_CLOSE, add_special_tokens=False)
    stop_ids = sorted(eng.eos_ids | (set(close) if len(close) == 1 else set()))

    episodes = {t.task_id: Episode(t.task_id, args.max_latency_s, args.seed) for t in tasks}
    ids = {t.task_id: list(p) for t, p in zip(tasks, prompts)}
    turns, turn_start, close_turn = dict.fromkeys(ids, 0), {}, {}
    pool = cf.ThreadPoolExecutor(args.num_trajectories)
    pending: dict[str, cf.Future] = {}
    tokens, steps, live, t0 = 0, 0, len(ids), time.perf_counter()

    def submit(rid):
        turn_start[rid] = len(ids[rid])
        params = SamplingParams(temperature=0.0, max_tokens=min(args.max_new_tokens, 4096 - len(ids[rid])), logprobs=0,
                                stop_token_ids=stop_ids, ignore_eos=True, detokenize=False, skip_special_tokens=False,
                                output_kind=RequestOutputKind.DELTA, extra_args=eng.runner.extra_args)
        llm.add_request(f"{rid}#{turns[rid]}", {"prompt_token_ids": list(ids[rid])}, params)

    for rid in ids:
        submit(rid)
    while live:
        for rid in [r for r, f in pending.items() if f.done()]:
            ids[rid] += render_tool_response(tok, pending.pop(rid).result().text, close_turn=close_turn[rid])
            turns[rid] += 1
            submit(rid)
        if not llm.has_unfinished_requests():
            time.sleep(0.002)  # only tools in flight
            continue
        steps += 1
        for out in llm.step():
            rid, why = out.request_id.split("#")[0], None
            for t in out.outputs[0].token_ids:
                ids[rid].append(t)
                tokens += 1
                why = _ends_turn(tok, ids[rid], eng.eos_ids, close)
                if why:
                    break
            if why is None and not out.finished:
                continue
            if not out.finished:
                llm.abort_request([out.request_id])  # stopped by text: vLLM does not know
            # the engine's rule: a turn holding a tool call runs it (however it ended), unless it was the last turn
            if has_tool_call(tok.decode(ids[rid][turn_start[rid]:])) and turns[rid] < 2 and len(ids[rid]) < 4096:
                close_turn[rid] = why != "eos"
                pending[rid] = pool.submit(episodes[rid].execute, None)
            else:
                live -= 1
    pool.shutdown()
    return tokens, time.perf_counter() - t0, steps


def run_generate(model, tok, tasks, prompts, args) -> tuple[int, float, int]:
    """Waves of `max_batch` trajectories (the same KV budget as the engine), each wave turn by turn."""
    tokens, wall_s, forwards = 0, 0.0, 0
    for start in range(0, len(tasks), args.max_batch):
        t, s, f = _generate_wave(model, tok, tasks[start : start + args.max_batch], prompts[start : start + args.max_batch], args)
        tokens, wall_s, forwards = tokens + t, wall_s + s, forwards + f
    return tokens, wall_s, forwards


def _ends_turn(tok, seq: list[int], eos_ids: set[int], close: list[int]) -> str | None:
    """Whether `seq`'s last token ends a turn: "eos", "call" (it completes `</tool_call>`, whose token ids are
    `close`: several in most vocabularies, so it is seen in the text, as vLLM's stop strings do), or None."""
    if seq[-1] in eos_ids:
        return "eos"
    hit = seq[-1] == close[0] if len(close) == 1 else tok.decode(seq[-len(close) - 2:]).endswith(TOOL_CALL_CLOSE)
    return "call" if hit else None


def _turn_end(tok, row: list[int], eos_ids: set[int]) -> int:
    """How many tokens of a generated `row` its turn holds: up to the first token that ends it (`_ends_turn`)."""
    close = tok.encode(TOOL_CALL_CLOSE, add_special_tokens=False)
    return next((i + 1 for i in range(len(row)) if _ends_turn(tok, row[: i + 1], eos_ids, close)), len(row))


def _generate_wave(model, tok, tasks, prompts, args) -> tuple[int, float, int]:
    eos_ids = turn_end_ids(tok, getattr(model, "generation_config", None))
    episodes = {t.task_id: Episode(t.task_id, args.max_latency_s, args.seed) for t in tasks}
    live = {t.task_id: list(ids) for t, ids in zip(tasks, prompts)}
    pool = cf.ThreadPoolExecutor(args.num_trajectories)
    tokens, t0, model.num_forwards = 0, time.perf_counter(), 0
    for turn in range(3):
        rids = list(live)
        width = max(len(live[r]) for r in rids)
        ids = torch.tensor([[tok.pad_token_id] * (width - len(live[r])) + live[r] for r in rids])
        mask = torch.tensor([[0] * (width - len(live[r])) + [1] * len(live[r]) for r in rids])
        # `</tool_call>` as a stop string, as a generate user writes it (its last token alone, `>` in SmolLM2's
        # vocabulary, would also end a turn at the `>` of the opening `<tool_call>`)
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.max_new_tokens, do_sample=False,
                             eos_token_id=sorted(eos_ids), stop_strings=[TOOL_CALL_CLOSE], tokenizer=tok,
                             pad_token_id=tok.pad_token_id)
        calls = {}
        for r, row in zip(rids, out[:, width:].tolist()):
            end = _turn_end(tok, row, eos_ids)
            live[r] += row[:end]
            tokens += end
            # the engine's rule: a turn holding a tool call runs it (however it ended), unless it was the last turn
            if has_tool_call(tok.decode(row[:end])) and turn < 2:
                calls[r] = (pool.submit(episodes[r].execute, None), row[end - 1] not in eos_ids)
            else:
                del live[r]
        for r, (fut, close_turn) in calls.items():
            live[r] += render_tool_response(tok, fut.result().text, close_turn=close_turn)
        live = {r: ids for r, ids in live.items() if r in calls}
        if not live:
            break
    pool.shutdown()
    return tokens, time.perf_counter() - t0, model.num_forwards


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--num-trajectories", type=int, default=32)
    ap.add_argument("--max-batch", type=int, default=8, help="sequences decoding at once (the KV budget), both systems")
    ap.add_argument("--max-latency-s", type=float, default=0.3)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-vllm", action="store_true", help="leave the vLLM backend's row out even where vLLM is installed")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_policy(args.model, device="cpu")
    tasks, prompts, script = workload(tok, args.num_trajectories, args.seed)
    call = tok.encode(CALL, add_special_tokens=False)
    banned = sorted({tok.eos_token_id, call[0], call[-1]})
    vllm, why_not = vllm_engine(model, tok, script, banned, args)  # before the patch: it saves the plain weights
    bias_policy(model, script, banned)
    run_engine(model, tok, tasks[:2], prompts[:2], args)  # warm-ups (generate's: its stop-string tables of the vocabulary)
    run_generate(model, tok, tasks[:1], prompts[:1], args)
    if vllm is not None:
        run_vllm(vllm, tasks[:2], prompts[:2], args)
    # this machine's speed swings by tens of percent: alternate the systems and keep each one's best
    runs = {"engine": [], "generate": []} | ({"vllm": [], "raw-vllm": []} if vllm is not None else {})
    for _ in range(args.rounds):
        runs["engine"].append(run_engine(model, tok, tasks, prompts, args))
        runs["generate"].append(run_generate(model, tok, tasks, prompts, args))
        if vllm is not None:
            runs["vllm"].append(run_vllm(vllm, tasks, prompts, args))
            runs["raw-vllm"].append(run_raw_vllm(vllm, tok, tasks, prompts, args))
    best = {name: min(r, key=lambda x: x[1]) for name, r in runs.items()}
    speed = {name: tokens / wall_s for name, (tokens, wall_s, _) in best.items()}
    print(f"{'system':<12}{'model tokens':>14}{'forwards':>10}{'best wall s':>13}{'tokens/s':>12}   all wall s")
    for name, (tokens, wall_s, fw) in best.items():
        print(f"{name:<12}{tokens:>14}{fw:>10}{wall_s:>13.2f}{speed[name]:>12.1f}   " + " ".join(f"{r[1]:.2f}" for r in runs[name]))
    print(f"workload: {args.model}, {args.num_trajectories} trajectories x up to 3 turns, tool latency U(0, {args.max_latency_s}) s, "
          f"best of {args.rounds} alternating rounds")
    if vllm is None:
        print(f"vllm: not run: {why_not}")
    else:
        vllm.close()
        print(f"vllm_vs_raw_vllm: {speed['vllm'] / speed['raw-vllm']:.2f}")
        print(f"vllm_vs_engine: {speed['vllm'] / speed['engine']:.2f}")
    print(f"rollout_vs_generate: {speed['engine'] / speed['generate']:.2f}")


if __name__ == "__main__":
    main()
