"""The python parts of bench/device_check.sh: a small Qwen-style model, rollout and trainer speed on a device.

    python -m engine.runtime.devcheck model --out DIR                      # build it in memory, save_pretrained
    python -m engine.runtime.devcheck rollout --model DIR --device cuda    # last line: rollout_tokens_per_s: X
    python -m engine.runtime.devcheck trainer --model DIR --device cuda    # last line: trainer_tokens_per_s: X

The model is a random Qwen2 (hidden 256, 4 layers, 8 heads / 4 kv heads, the tiny tokenizer),
large enough that a GPU has work and small enough that it builds in a second without a hub.
`rollout` decodes `--num-requests` greedy single-turn trajectories through `RolloutEngine`
(batched KV, the run's precision: bf16 on CUDA/NPU); `trainer` times GRPO steps of `Trainer` on
random trajectories with mixed rewards (so every step really runs forward and backward). Both run
on CPU as well (`--device cpu`), which is how tests/engine/runtime/test_devcheck.py dry-runs them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch


def small_qwen(seed: int = 0):
    """(model, tokenizer): a random Qwen2 of ~4M parameters with the tiny in-memory tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from engine.models import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def rollout_speed(model_spec: str, device: str, *, num_requests: int = 16, max_new_tokens: int = 64) -> dict:
    from engine.models import load_policy, render_prompt
    from engine.precision import precision_for
    from engine.rollout.engine import Finished, RolloutConfig, RolloutEngine, RolloutRequest
    from envs.base import Task, ToolResult

    dev = torch.device(device)
    model, tok = load_policy(model_spec, device=dev, dtype=precision_for(dev.type).rollout_dtype)
    cfg = RolloutConfig(temperature=0.0, max_new_tokens_per_turn=max_new_tokens, max_turns=1, max_batch=num_requests,
                        max_total_tokens=4096, tool_workers=2)
    engine = RolloutEngine(model, tok, cfg, device=dev)

    class Episode:
        def execute(self, call):
            return ToolResult(tool="x", text="ok", status="success")

        def score(self, final_text):
            return 0.0

        def close(self):
            pass

    for i in range(num_requests):
        msgs = ({"role": "user", "content": f"Count to {i + 3} and then say the word red."},)
        engine.add(RolloutRequest(request_id=f"r{i}", task=Task(task_id=f"t{i}", bench="toy", messages=msgs, tools=()),
                                  episode=Episode(), prompt_ids=render_prompt(tok, msgs, ()), group_id=f"g{i}"))
    _sync(dev)
    t0 = time.perf_counter()
    done, tokens = 0, 0
    while done < num_requests:
        for e in engine.step():
            if isinstance(e, Finished):
                done += 1
                tokens += e.trajectory.num_model_tokens
    _sync(dev)
    wall = time.perf_counter() - t0
    engine.close()
    return {"device": str(dev), "dtype": str(next(model.parameters()).dtype), "requests": num_requests,
            "model_tokens": tokens, "wall_s": wall, "rollout_tokens_per_s": tokens / wall}


def trainer_speed(model_spec: str, device: str, *, num_trajectories: int = 8, seq_len: int = 256, steps: int = 2) -> dict:
    from engine.models import load_policy
    from engine.trainer.trainer import Trainer, TrainerConfig
    from engine.trajectory import Trajectory

    dev = torch.device(device)
    model, tok = load_policy(model_spec, device=dev)
    trainer = Trainer(model, TrainerConfig(lr=1e-5, micro_batch_tokens=4 * seq_len, off_policy="recompute-all"), device=dev)
    gen = torch.Generator().manual_seed(0)
    prompt = seq_len // 2

    def batch(version: int) -> list[Trajectory]:
        out = []
        for i in range(num_trajectories):
            ids = torch.randint(0, len(tok), (seq_len,), generator=gen).tolist()
            out.append(Trajectory(request_id=f"r{version}-{i}", task_id=f"t{i // 4}", group_id=f"g{i // 4}", prompt_len=prompt,
                                  token_ids=ids, loss_mask=[0] * prompt + [1] * (seq_len - prompt), logprobs=[0.0] * seq_len,
                                  versions=[-1] * prompt + [version] * (seq_len - prompt), reward=float(i % 2)))
        return out

    trainer.train_step(batch(0), 0)  # warm-up (allocator, kernels)
    _sync(dev)
    t0 = time.perf_counter()
    for s in range(1, steps + 1):
        metrics = trainer.train_step(batch(s), s)
    _sync(dev)
    wall = time.perf_counter() - t0
    assert metrics["train/stepped"] == 1.0
    return {"device": str(dev), "compute": str(trainer.precision.compute_dtype), "steps": steps,
            "tokens": steps * num_trajectories * seq_len, "wall_s": wall,
            "trainer_tokens_per_s": steps * num_trajectories * seq_len / wall}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.runtime.devcheck", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    m = sub.add_parser("model", help="build the small Qwen-style model and save it")
    m.add_argument("--out", required=True)
    for name in ("rollout", "trainer"):
        s = sub.add_parser(name)
        s.add_argument("--model", required=True, help="tiny, smollm2 or a local HF dir (e.g. the one `model` wrote)")
        s.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    if args.what == "model":
        model, tok = small_qwen()
        model.save_pretrained(Path(args.out))
        tok.save_pretrained(Path(args.out))
        print(f"small_qwen_params: {sum(t.numel() for t in model.parameters())}")
        return 0
    torch.set_num_threads(max(1, torch.get_num_threads()))
    result = (rollout_speed if args.what == "rollout" else trainer_speed)(args.model, args.device)
    key = f"{args.what}_tokens_per_s"
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items() if k != key))
    print(f"{key}: {result[key]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
