"""Plain batched decode: the rollout engine against `model.generate`, with no tools in the way.

N prompts (default 32) of `--prompt-tokens` tokens each, each a different text (`prompts`), up to `--new-tokens` new tokens each
(a row stops at the model's end-of-sequence token), greedy, one batch. Systems, alternated
for `--rounds` rounds (this machine's speed swings by tens of percent; each keeps its best):

  engine             RolloutEngine: in-place KV cache (engine/rollout/kv_cache.py), linears through
                     oneDNN (engine/rollout/cpu_linear.py), float32
  engine-mkl         the same engine with PyTorch's default CPU linear (MKL sgemm, as `generate`
                     runs it; `linears="default"`): what the cache and the batching buy without
                     the kernel choice
  engine-concat      the engine with transformers' DynamicCache (grows by torch.cat every step;
                     `kv_cache="concat"`), oneDNN linears, float32
  generate           `model.generate`, float32
  engine-bf16        the engine with the model in bfloat16 (`--rollout.dtype bfloat16`; log-probs
                     still taken in float32), when this CPU has bf16 matmul
  generate-bf16      `model.generate` in bfloat16

Greedy tokens of engine, engine-mkl, engine-concat and generate are compared (they must be equal in float32).

Prints a table and, last, `decode_engine_vs_generate: R` (engine tokens/s over generate's, fp32).
"""

from __future__ import annotations

import argparse
import time

import torch

from engine.models import load_policy
from engine.precision import cpu_has_bf16_matmul
from engine.rollout.engine import Finished, RolloutConfig, RolloutEngine, RolloutRequest, eos_ids
from envs.base import Task


class NoTools:
    def execute(self, call):
        raise AssertionError("plain decode runs no tools")

    def score(self, final_text):
        return 0.0

    def close(self):
        pass


WORDS = "the quick brown fox jumps over the lazy dog while seven curious otters count river stones".split()


def prompts(tok, n: int, length: int) -> list[list[int]]:
    """`n` prompts of `length` tokens, each a different text: no two share a prefill (the engine prefills
    identical fresh prompts once, a GRPO group's saving that plain decode must not get) or a prefix (vLLM's cache)."""
    out = []
    for i in range(n):
        words = [WORDS[(i * 7 + j * (i % 5 + 1)) % len(WORDS)] for j in range(length)]
        out.append(tok.encode(f"{i}: " + " ".join(words), add_special_tokens=False)[:length])
    return out


def workload_args(ap: argparse.ArgumentParser) -> None:
    """The plain-decode workload's flags, shared with bench.vllm_decode."""
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)


def drive(engine, ids_list: list[list[int]]) -> tuple[list[list[int]], float]:
    """Decode every prompt to its end on `engine` (torch or vLLM backend); each row's new tokens, and the wall time."""
    task = Task(task_id="t", bench="toy", messages=({"role": "user", "content": "x"},), tools=())
    start = time.perf_counter()
    for i, ids in enumerate(ids_list):
        engine.add(RolloutRequest(f"r{i}", task, NoTools(), list(ids), "g"))
    out = {}
    while not engine.idle:
        for event in engine.step():
            if isinstance(event, Finished):
                traj = event.trajectory
                out[traj.request_id] = traj.token_ids[traj.prompt_len:]
    return [out[f"r{i}"] for i in range(len(ids_list))], time.perf_counter() - start


def run_engine(model, tok, ids_list, new_tokens: int, **options) -> tuple[list[list[int]], float]:
    """The engine over `ids_list`; `options` are RolloutEngine's baseline switches (kv_cache, linears)."""
    cfg = RolloutConfig(temperature=0.0, max_new_tokens_per_turn=new_tokens, max_turns=1,
                        max_total_tokens=max(map(len, ids_list)) + new_tokens + 1, max_batch=len(ids_list))
    engine = RolloutEngine(model, tok, cfg, **options)
    try:
        return drive(engine, ids_list)
    finally:
        engine.close()


def run_generate(model, tok, ids_list, new_tokens: int) -> tuple[list[list[int]], float]:
    width = max(map(len, ids_list))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids_list])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids_list])
    stop = sorted(eos_ids(tok, getattr(model, "generation_config", None)))
    start = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                         eos_token_id=stop, pad_token_id=pad)
    elapsed = time.perf_counter() - start
    rows = [row[:next((i + 1 for i, t in enumerate(row) if t in stop), len(row))] for row in out[:, width:].tolist()]
    return rows, elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_args(ap)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_policy(args.model, device="cpu")
    model.eval()
    ids_list = prompts(tok, args.num_prompts, args.prompt_tokens)
    systems = {"engine": lambda: run_engine(model, tok, ids_list, args.new_tokens),
               "engine-mkl": lambda: run_engine(model, tok, ids_list, args.new_tokens, linears="default"),
               "engine-concat": lambda: run_engine(model, tok, ids_list, args.new_tokens, kv_cache="concat"),
               "generate": lambda: run_generate(model, tok, ids_list, args.new_tokens)}
    if cpu_has_bf16_matmul():
        model16, _ = load_policy(args.model, device="cpu", dtype=torch.bfloat16)
        model16.eval()
        systems["engine-bf16"] = lambda: run_engine(model16, tok, ids_list, args.new_tokens)
        systems["generate-bf16"] = lambda: run_generate(model16, tok, ids_list, args.new_tokens)
    run_engine(model, tok, ids_list[:2], 4)  # warm-up
    runs: dict[str, list[float]] = {name: [] for name in systems}
    tokens: dict[str, list[list[int]]] = {}
    for _ in range(args.rounds):
        for name, fn in systems.items():
            tokens[name], elapsed = fn()
            runs[name].append(elapsed)
    print(f"{'system':<15}{'tokens':>8}{'best s':>9}{'tokens/s':>10}{'vs generate':>13}   all s")
    speed = {name: sum(map(len, tokens[name])) / min(r) for name, r in runs.items()}
    for name, r in runs.items():
        ref = "generate-bf16" if name.endswith("bf16") else "generate"
        print(f"{name:<15}{sum(map(len, tokens[name])):>8}{min(r):>9.2f}{speed[name]:>10.1f}{speed[name] / speed[ref]:>13.2f}   "
              + " ".join(f"{x:.2f}" for x in r))
    same = tokens["engine"] == tokens["generate"] == tokens["engine-concat"] == tokens["engine-mkl"]
    print(f"{args.model}, {args.num_prompts} prompts x {args.prompt_tokens} tokens, {args.new_tokens} new tokens greedy, "
          f"{args.threads} threads, best of {args.rounds}; fp32 greedy tokens equal across engine, engine-mkl, engine-concat, "
          f"generate: {same}")
    if "engine-bf16" in tokens:
        agree = sum(a == b for a, b in zip(tokens["engine-bf16"], tokens["generate-bf16"]))
        print(f"bf16: engine and generate agree on {agree}/{args.num_prompts} rows (bf16 rounding differs by kernel)")
    print(f"decode_engine_vs_generate: {speed['engine'] / speed['generate']:.2f}")


if __name__ == "__main__":
    main()
