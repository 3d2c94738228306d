"""Plain decoding throughput: the torch rollout engine vs the vLLM backend, on the same prompts and weights.

Workload: N prompts (default 32) of P tokens (default 200, distinct text per prompt), M new tokens
each (default 128), greedy, no tools. End of turn is banned (eos, `<|im_end|>`, `</tool_call>` lose
`--ban` logits, in a forward hook for the torch engine and a vLLM logits processor for vLLM), so
both systems write exactly M tokens per prompt. Both get the same `--max-batch` (sequences decoding
at once). The model is loaded in `--dtype` for both (float32 or bfloat16). vLLM's engine core
runs in a child process; its start-up is timed apart and its prefix cache emptied before each round. Speeds on
shared CPUs swing: the two alternate for `--rounds` rounds and each keeps its best.

Prints a table and, last, `vllm_vs_engine: R` (vLLM model tokens/s over the torch engine's).
Needs vLLM (`LIBRA_VLLM=1 bash run.sh`).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from bench.decode import drive, prompts, workload_args
from engine.chat import IM_END, TOOL_CALL_CLOSE
from engine.models import load_policy, save_policy_dir
from engine.rollout.engine import RolloutConfig, RolloutEngine

def ban_hook(model, banned: list[int], ban: float):
    def hook(_module, _args, out):
        out.logits[..., banned] -= ban
        return out

    return model.register_forward_hook(hook)


def timed(engine, ids_list, reset=None) -> tuple[int, float]:
    if reset is not None:
        reset()
    rows, wall_s = drive(engine, ids_list)
    return sum(map(len, rows)), wall_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_args(ap)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ban", type=float, default=1e4)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_policy(args.model, device="cpu", dtype=getattr(torch, args.dtype))
    ids_list = prompts(tok, args.num_prompts, args.prompt_tokens)
    banned = sorted({tok.eos_token_id, *tok.encode(IM_END, add_special_tokens=False)[:1],
                     *tok.encode(TOOL_CALL_CLOSE, add_special_tokens=False)[-1:]})
    cfg = RolloutConfig(temperature=0.0, max_new_tokens_per_turn=args.new_tokens, max_turns=1,
                        max_total_tokens=args.prompt_tokens + args.new_tokens + 8, max_batch=args.max_batch)

    from engine.rollout.vllm_engine import VllmRolloutEngine
    from engine.rollout.vllm_script import ScriptLogits

    with tempfile.TemporaryDirectory(prefix="libra-bench-") as tmp:  # vLLM reads the weights at start-up only
        path = save_policy_dir(model, tok, Path(tmp) / "policy")
        t0 = time.perf_counter()
        vllm = VllmRolloutEngine(path, tok, cfg, dtype=args.dtype, kv_cache_mb=1024,
                                 engine_kwargs={"logits_processors": [ScriptLogits]},
                                 sampling_extra_args={"libra_banned": banned, "libra_ban": args.ban})
        start_s = time.perf_counter() - t0
    ban_hook(model, banned, args.ban)
    runs = {"engine": [], "vllm": []}
    timed(RolloutEngine(model, tok, cfg), ids_list[:2])  # warm-up
    timed(vllm, ids_list[:2])
    for _ in range(args.rounds):
        runs["engine"].append(timed(RolloutEngine(model, tok, cfg), ids_list))
        runs["vllm"].append(timed(vllm, ids_list, reset=vllm.llm.reset_prefix_cache))
    vllm.close()
    best = {k: min(v, key=lambda r: r[1]) for k, v in runs.items()}
    speed = {k: tokens / wall_s for k, (tokens, wall_s) in best.items()}
    print(f"{'system':<10}{'model tokens':>14}{'best wall s':>13}{'tokens/s':>11}   all wall s")
    for name, (tokens, wall_s) in best.items():
        print(f"{name:<10}{tokens:>14}{wall_s:>13.2f}{speed[name]:>11.1f}   " + " ".join(f"{r[1]:.2f}" for r in runs[name]))
    print(f"workload: {args.model} {args.dtype}, {args.num_prompts} prompts x {args.prompt_tokens} tokens, {args.new_tokens} new, greedy, "
          f"max batch {args.max_batch}, torch threads {torch.get_num_threads()}; vLLM start-up {start_s:.1f} s (not counted)")
    print(f"vllm_vs_engine: {speed['vllm'] / speed['engine']:.2f}")


if __name__ == "__main__":
    main()
