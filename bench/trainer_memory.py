"""Trainer memory and speed per context length, with and without each memory switch.

For each model and context length L the benchmark trains one GRPO step on a batch with a tail
(trajectories of L, 3L/4, L/2 and L/4 tokens, a quarter of each prompt, alternating rewards),
`micro_batch_tokens` = L, in a fresh process per configuration, so that each peak is its own:

  whole     padded micro-batches, whole-vocabulary float32 logits, no activation checkpointing
            (the trainer before issue 23)
  chunked   log-probs 512 tokens at a time through the output layer (the default chunk)
  +ckpt     chunked, plus activation checkpointing of every decoder layer
  +packed   chunked, checkpointed, and packed micro-batches instead of padded ones

Peak memory is the process's peak RSS during the step (`engine.devices.peak_memory_mb` after a
`reset_peak_memory()` just before it: VmHWM, reset through /proc/self/clear_refs) minus its RSS
before it: what the step adds to the loaded model. The first step also allocates AdamW's two
moments (2 x 4 bytes per parameter), the same in every configuration. `proc` is the process's own
peak RSS (model, gradients, optimizer and runtime included).
tokens/s counts the batch's tokens over the step's wall time (one step, no warm-up: a long step
is dominated by its compute); with `--rounds R` the configurations alternate R times and each
keeps its fastest step (this machine's speed drifts by tens of percent). A configuration whose whole-logits tensors alone would exceed
`--max-logits-gb` is skipped and said so, rather than swapping the machine.

Models: `smollm2` (SmolLM2-135M: vocabulary 49,152, 30 layers), and `wide-vocab` (a random
2-layer model with Qwen3's 151,936-token vocabulary and hidden size 64: its logits are as large per
token as at the paper's scale, and cheap enough to reach 16k tokens on a CPU).

Prints a table and, last, `trainer_peak_whole_vs_lean: R`: peak memory of `whole` over `+packed`
at the longest context where both ran, for the last model.

    python -m bench.trainer_memory [--models wide-vocab,smollm2] [--contexts 1024,2048,4096,8192,16384]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CONFIGS = {  # the chunked ones use TrainerConfig's default chunk
    "whole": {"pack_sequences": False, "logprob_chunk_tokens": 0, "activation_checkpointing": "off"},
    "chunked": {"pack_sequences": False, "activation_checkpointing": "off"},
    "+ckpt": {"pack_sequences": False, "activation_checkpointing": "on"},
    "+packed": {"pack_sequences": True, "activation_checkpointing": "on"},
}
WIDE_VOCAB = 151_936


def _model(name: str):
    import torch

    from engine.models import load_policy

    if name != "wide-vocab":
        model, _ = load_policy(name, device="cpu")
        return model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=WIDE_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True)
    config._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(config)


def batch(context: int, vocab: int):
    import torch

    from engine.trajectory import Trajectory

    gen = torch.Generator().manual_seed(context)
    out = []
    for i, n in enumerate((context, 3 * context // 4, context // 2, context // 4)):
        prompt = n // 4
        ids = torch.randint(0, vocab, (n,), generator=gen).tolist()
        out.append(Trajectory(request_id=f"r{i}", task_id="t", group_id="g", prompt_len=prompt, token_ids=ids,
                              loss_mask=[0] * prompt + [1] * (n - prompt), logprobs=[0.0] * prompt + [-5.0] * (n - prompt),
                              versions=[-1] * prompt + [0] * (n - prompt), reward=float(i % 2)))
    return out


def run_one(spec: dict) -> dict:
    """In this process: build the model and trainer, then time one step and measure what it adds."""
    import torch

    from engine.devices import peak_memory_mb, reset_peak_memory, rss_mb
    from engine.trainer.trainer import Trainer, TrainerConfig

    torch.set_num_threads(spec["threads"])
    model = _model(spec["model"])
    vocab = model.config.vocab_size
    trainer = Trainer(model, TrainerConfig(lr=1e-6, micro_batch_tokens=spec["context"], **CONFIGS[spec["config"]]))
    trajs = batch(spec["context"], vocab)
    before = rss_mb()
    if not reset_peak_memory():
        raise RuntimeError("cannot reset this process's peak RSS (/proc/self/clear_refs): the step's peak is unmeasurable here")
    start = time.perf_counter()
    metrics = trainer.train_step(trajs, 0)
    elapsed = time.perf_counter() - start
    peak = peak_memory_mb().host_mb
    return {"peak_mb": peak - before, "process_peak_mb": peak, "tokens_per_s": metrics["train/tokens"] / elapsed, "step_s": elapsed,
            "micro_batches": metrics["train/micro_batches"], "loss": metrics["train/loss"], "vocab": vocab}


def measure(spec: dict, timeout_s: float) -> dict:
    proc = subprocess.run([sys.executable, "-m", "bench.trainer_memory", "--one", json.dumps(spec)],
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:120]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="wide-vocab,smollm2", help="comma-separated: wide-vocab, smollm2, tiny, or local HF dirs")
    parser.add_argument("--contexts", default="1024,2048,4096,8192,16384", help="longest trajectory per batch, tokens")
    parser.add_argument("--max-context", default="smollm2=2048", help="per model caps, e.g. smollm2=4096 (CPU time)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {list(CONFIGS)}")
    parser.add_argument("--max-logits-gb", type=float, default=3.0, help="skip whole-logits runs whose logits would exceed this")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds; each configuration keeps its fastest step")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per configuration")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.one:
        print(json.dumps(run_one(json.loads(args.one))))
        return

    caps = dict(item.split("=") for item in args.max_context.split(",") if item)
    vocab_of = {"wide-vocab": WIDE_VOCAB, "smollm2": 49_152}
    rows, headline = [], float("nan")
    print(f"{'model':<11} {'context':>7} {'config':<8} {'peak MB':>9} {'proc MB':>8} {'tokens/s':>9} {'step s':>7} {'micro':>5} {'loss':>9}", flush=True)
    for model in args.models.split(","):
        peaks: dict[tuple[int, str], float] = {}
        for context in (int(c) for c in args.contexts.split(",")):
            if context > int(caps.get(model, 1 << 30)):
                continue
            configs = []
            for config in args.configs.split(","):
                logits_gb = context * vocab_of.get(model, 0) * 4 / 1e9
                if config == "whole" and logits_gb > args.max_logits_gb:
                    print(f"{model:<11} {context:>7} {config:<8} skipped: its float32 logits alone are {logits_gb:.1f} GB "
                          f"(x3 with softmax and gradient) > --max-logits-gb {args.max_logits_gb}", flush=True)
                else:
                    configs.append(config)
            best: dict[str, dict] = {}
            for _ in range(args.rounds):  # alternate the configurations: this machine's speed drifts
                for config in configs:
                    r = measure({"model": model, "context": context, "config": config, "threads": args.threads}, args.timeout_s)
                    if "error" not in r and (config not in best or r["step_s"] < best[config]["step_s"]):
                        for key in ("peak_mb", "process_peak_mb"):
                            r[key] = max(r[key], best.get(config, {}).get(key, 0.0))
                        best[config] = r
                    elif "error" in r:
                        best.setdefault(config, r)
            for config in configs:
                r = best[config]
                if "error" in r:
                    print(f"{model:<11} {context:>7} {config:<8} failed: {r['error']}", flush=True)
                    continue
                peaks[(context, config)] = r["peak_mb"]
                rows.append((model, context, config, r))
                print(f"{model:<11} {context:>7} {config:<8} {r['peak_mb']:>9.0f} {r['process_peak_mb']:>8.0f} {r['tokens_per_s']:>9.1f} {r['step_s']:>7.1f} "
                      f"{r['micro_batches']:>5.0f} {r['loss']:>9.5f}", flush=True)
        both = [c for (c, cfg) in peaks if cfg == "whole" and (c, "+packed") in peaks]
        if both:
            top = max(both)
            headline = peaks[(top, "whole")] / max(peaks[(top, "+packed")], 1.0)
    print(f"batch per step: 4 trajectories of L, 3L/4, L/2, L/4 tokens; micro_batch_tokens = L; {args.threads} torch threads; "
          f"peak = peak RSS during the step minus RSS before it, proc = the process's peak RSS (model, optimizer and all); best of {args.rounds} alternating round(s)")
    print(f"trainer_peak_whole_vs_lean: {headline:.2f}")


if __name__ == "__main__":
    main()
