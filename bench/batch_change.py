"""What a batch change costs the rollout engine: rows leaving the batched KV cache one at a time vs at
once, and a GRPO group joining with its shared prompt prefilled once vs once per sample.

`python -m bench.batch_change [--model smollm2] [--rows 32] [--prompt-tokens 200] [--decode-steps 8]`
builds a `BatchRunner` batch (prefill, admit, decode), then drops every row, either one call per row
(each call copies the remaining batch: what the engine did before `drop` took a list) or one call
for all of them, alternating for `--rounds` rounds and keeping each one's best. The last line is
`drop_one_by_one_vs_at_once: R` (how many times slower one at a time is), with a decode step's time
beside it for scale. Before it, the prefill of `--group` samples of one prompt (the engine prefills it
once and shares the KV) against `--group` distinct prompts of the same length (each prefilled),
`group_prefill_distinct_vs_shared: R`.
"""

from __future__ import annotations

import argparse
import time

import torch

from engine.models import load_policy
from engine.rollout.runner import BatchRunner


def _batch(model, rows: int, prompt_tokens: int, decode_steps: int) -> tuple[BatchRunner, list[str], float]:
    runner = BatchRunner(model, device="cpu")
    rids = [f"r{i}" for i in range(rows)]
    runner.prefill(rids, [list(range(1, prompt_tokens + 1))] * rows)
    runner.admit(rids)
    t0 = time.perf_counter()
    for _ in range(decode_steps):
        runner.decode([5] * rows)
    return runner, rids, (time.perf_counter() - t0) / max(decode_steps, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument("--decode-steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--group", type=int, default=4)
    args = p.parse_args()
    torch.manual_seed(0)
    model, _ = load_policy(args.model, device="cpu", dtype=torch.float32, seed=0)
    prefill = {"shared prompt": float("inf"), "distinct prompts": float("inf")}
    for _ in range(args.rounds):
        for how in prefill:
            prompts = [[(j if how == "distinct prompts" else 0) + t for t in range(1, args.prompt_tokens + 1)]
                       for j in range(args.group)]
            t0 = time.perf_counter()
            BatchRunner(model, device="cpu").prefill([f"s{j}" for j in range(args.group)], prompts)
            prefill[how] = min(prefill[how], time.perf_counter() - t0)
    print(f"{args.model}: a group of {args.group} samples, {args.prompt_tokens}-token prompts")
    for how, s in prefill.items():
        print(f"  prefill, {how:<16} {s * 1e3:9.1f} ms")
    print(f"group_prefill_distinct_vs_shared: {prefill['distinct prompts'] / prefill['shared prompt']:.2f}")
    best = {"one by one": float("inf"), "at once": float("inf")}
    step_s = float("inf")
    for _ in range(args.rounds):
        for how in best:
            runner, rids, decode_s = _batch(model, args.rows, args.prompt_tokens, args.decode_steps)
            step_s = min(step_s, decode_s)
            t0 = time.perf_counter()
            if how == "one by one":
                for rid in rids:
                    runner.drop([rid])
            else:
                runner.drop(rids)
            best[how] = min(best[how], time.perf_counter() - t0)
    context = args.prompt_tokens + args.decode_steps
    print(f"{args.model}: {args.rows} rows at context {context}; a decode step {step_s * 1e3:.0f} ms")
    for how, s in best.items():
        print(f"  drop every row {how:<10} {s * 1e3:9.1f} ms")
    print(f"drop_one_by_one_vs_at_once: {best['one by one'] / max(best['at once'], 1e-9):.0f}")


if __name__ == "__main__":
    main()
