"""How often the policy writes a well-formed tool call, with and without a demonstration turn.

For each bench (default toy, math, search, swe) the prompt is the first level-0 task rendered
exactly as the runtime renders it (`render_prompt`, Hermes tools block); the demonstration
variant adds one exchange from the next task (`envs/demo.py`, what `--demo-turns 1` does). The
model samples `--samples` first turns per variant at the CPU preset's temperature and top-p,
and each completion is classed:

  tagged       it wrote a `<tool_call>` tag;
  well-formed  every call in it parses: a JSON object with a string "name" and object "arguments";
  valid        well-formed, and every call fits the task's schemas (known tool, right arguments).

Prints a table and, last, `toolcall_rate: R`: the well-formed fraction with the demonstration,
over all benches.

    python -m bench.toolcalls [--model smollm2] [--benches toy,math,search,swe] [--samples 50]
"""

from __future__ import annotations

import argparse
import time

import torch

from engine.chat import IM_END
from engine.models import load_policy, render_prompt
from envs.base import validate_call
from envs.demo import add_demo_turns
from envs.registry import make_env, scripted_agents
from envs.toolcalls import ToolCall, parse_tool_calls

MAX_NEW_TOKENS = {"swe": 160}  # a level-0 swe call quotes two lines of code; the others fit in 64


def classify(text: str, tools) -> str:
    calls = parse_tool_calls(text)
    if not calls:
        return "none"
    if not all(isinstance(c, ToolCall) for c in calls):
        return "malformed"
    return "valid" if all(validate_call(c, tools) is None for c in calls) else "well-formed"


def sample(model, tok, prompt_ids: list[int], *, num: int, max_new_tokens: int, temperature: float,
           top_p: float, seed: int, batch: int) -> list[str]:
    """`num` sampled first turns of the prompt, in batches of `batch` (the KV cache grows with both)."""
    ids = torch.tensor([prompt_ids])
    stop = tok.convert_tokens_to_ids(IM_END)
    torch.manual_seed(seed)
    texts = []
    for start in range(0, num, batch):
        n = min(batch, num - start)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=temperature,
                                 top_p=top_p, max_new_tokens=max_new_tokens, num_return_sequences=n,
                                 pad_token_id=tok.pad_token_id, eos_token_id=stop)
        texts += tok.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
    return texts


def main(argv: list[str] | None = None) -> float:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2, tiny, or a local HF checkpoint directory")
    p.add_argument("--benches", default="toy,math,search,swe")
    p.add_argument("--samples", type=int, default=50, help="sampled first turns per bench and variant")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--batch", type=int, default=25)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    model, tok = load_policy(args.model)
    print(f"{'bench':<8} {'variant':<8} {'prompt':>6} {'tagged':>7} {'well-formed':>12} {'valid':>6} {'s':>5}")
    demo_counts = [0, 0]
    for bench in args.benches.split(","):
        tasks = make_env(bench, seed=args.seed, level=None if bench == "toy" else 0).tasks()
        variants = {"plain": tasks[0], "demo": add_demo_turns(tasks, 1, scripted_agents(bench)[0])[0]}
        for name, task in variants.items():
            prompt = render_prompt(tok, list(task.messages), list(task.tools))
            t0 = time.perf_counter()
            texts = sample(model, tok, prompt, num=args.samples, max_new_tokens=MAX_NEW_TOKENS.get(bench, 64),
                           temperature=args.temperature, top_p=args.top_p, seed=args.seed, batch=args.batch)
            kinds = [classify(t, task.tools) for t in texts]
            tagged = sum(k != "none" for k in kinds)
            formed = sum(k in ("well-formed", "valid") for k in kinds)
            valid = kinds.count("valid")
            print(f"{bench:<8} {name:<8} {len(prompt):>6} {tagged:>4}/{len(texts):<2} {formed:>9}/{len(texts):<2} "
                  f"{valid:>3}/{len(texts):<2} {time.perf_counter() - t0:>5.0f}", flush=True)
            if name == "demo":
                demo_counts[0] += formed
                demo_counts[1] += len(texts)
    rate = demo_counts[0] / demo_counts[1]
    print(f"toolcall_rate: {rate:.2f}")
    return rate


if __name__ == "__main__":
    main()
