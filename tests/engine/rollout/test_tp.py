"""Tensor-parallel rollout on 2 gloo processes: logits and generated trajectories match TP=1."""

import os
import socket
import time
from datetime import timedelta

import pytest
import torch
import torch.multiprocessing as mp

from scripted_model import Scripted

CALL = '<tool_call>\n{"name": "calc", "arguments": {}}\n</tool_call>'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Episode:
    def execute(self, call):
        from envs.base import ToolResult

        time.sleep(0.002)
        return ToolResult(tool=getattr(call, "name", "<parse>"), text="ok", status="success")

    def score(self, final_text):
        return 0.5

    def close(self):
        pass


def _generate(model, tok, tp_group):
    from engine.models import render_prompt
    from engine.rollout.engine import Finished, RolloutConfig, RolloutEngine, RolloutRequest
    from envs.base import Task

    cfg = RolloutConfig(temperature=0.0, max_new_tokens_per_turn=24, max_turns=3, max_total_tokens=160, max_batch=3)
    eng = RolloutEngine(Scripted(model, {30 + i: t for i, t in enumerate(tok.encode(CALL, add_special_tokens=False))}),
                        tok, cfg, tp_group=tp_group)
    if eng.runner.is_leader:
        for i in range(4):
            task = Task(task_id=f"t{i}", bench="toy", messages=({"role": "user", "content": "go " * i},), tools=())
            eng.add(RolloutRequest(f"r{i}", task, _Episode(), render_prompt(tok, task.messages, ()), "g"))
    done = {}
    while True:
        for ev in eng.step():
            if isinstance(ev, Finished):
                done[ev.request_id] = (ev.trajectory.token_ids, ev.trajectory.logprobs, len(ev.trajectory.turns))
        if eng.idle:
            break
    eng.close()
    return done


def _worker(rank, port, queue):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    import torch.distributed as dist

    from engine.models import build_tiny
    from engine.rollout.tp import load_full_weights, parallelize

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        model, tok = build_tiny(0)
        ids = torch.tensor([[5, 17, 42, 99, 7, 250, 3]])
        with torch.no_grad():
            ref = model(input_ids=ids).logits
        ref_gen = _generate(model, tok, None) if rank == 0 else None
        group = dist.new_group([0, 1], timeout=timedelta(seconds=60))
        parallelize(model, group)
        with torch.no_grad():
            tp_logits = model(input_ids=ids).logits
        tp_gen = _generate(model, tok, group)
        other, _ = build_tiny(1)
        load_full_weights(model, dict(other.state_dict()))
        with torch.no_grad():
            swapped = (model(input_ids=ids).logits - other(input_ids=ids).logits).abs().max().item()
        queue.put((rank, (tp_logits - ref).abs().max().item(), swapped, ref_gen, tp_gen))
    finally:
        dist.destroy_process_group()


def test_tp2_gloo_matches_tp1():
    ctx = mp.get_context("forkserver")
    # import the heavy modules once in the fork server instead of once per rank
    ctx.set_forkserver_preload(["engine.models", "engine.rollout.engine", "engine.rollout.tp", "transformers.models.qwen2.modeling_qwen2", "tokenizers"])
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        results = {}
        for _ in range(2):
            rank, *rest = queue.get(timeout=150)
            results[rank] = rest
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    for rank in (0, 1):
        logit_err, swap_err, _, _ = results[rank]
        assert logit_err < 1e-4 and swap_err < 1e-4
    _, _, ref_gen, tp_gen = results[0]
    assert results[1][3] == {} and set(tp_gen) == {"r0", "r1", "r2", "r3"}
    for rid, (ids, logprobs, num_turns) in ref_gen.items():
        assert tp_gen[rid][0] == ids and tp_gen[rid][2] == num_turns
        assert max(abs(a - b) for a, b in zip(logprobs, tp_gen[rid][1])) < 1e-4
    assert any(n > 1 for _, _, n in ref_gen.values())


def test_tp_degree_must_divide_heads():
    from engine.models import build_tiny
    from engine.rollout.tp import check_tp_degree

    model, _ = build_tiny(0)
    with pytest.raises(ValueError, match=r"TP degree 3 must divide attention heads \(4\), kv heads \(2\) and intermediate size \(128\)"):
        check_tp_degree(model.config, 3)
