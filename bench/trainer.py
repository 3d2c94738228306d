"""Trainer throughput: tokens/s of `Trainer.train_step`, one rank vs FSDP2 over two ranks.

For each model (tiny, smollm2) and each rank count (1, 2) the benchmark spawns that many gloo
ranks on CPU with `--threads-per-rank` threads each (default 1, so the ratio reads as the
scaling from one core to two; on a loaded 2-core box one rank with 2 OpenMP threads measured
~5x slower than 2 ranks x 1 thread, which says more about OpenMP spinning under contention
than about FSDP2). Every rank trains on
the same synthetic batch of GRPO groups (random token ids, half prompt, alternating rewards),
one warm-up step, then `--steps` timed steps; tokens/s counts every token of the batch
(prompt included, that is what the forward pays for) over the slowest rank's time.

Prints a table and, last, `trainer_fsdp2_vs_1: R`: tokens/s with 2 FSDP2 ranks over 1 rank for
the last model benchmarked (smollm2 by default); 2.0 is perfect scaling, the gap is the gloo
all-gathers and reduce-scatters plus the cores other processes take. The measurement is the
machine profile's own (`engine.runtime.profile.train_rate`, what `python -m bench.profile` runs per
trainer rank count); this module is its table.

    python -m bench.trainer [--models tiny,smollm2] [--steps 2] [--num-trajectories 8] [--seq-len 128]
                            [--threads-per-rank 1]
"""

from __future__ import annotations

import argparse
import os

from engine.runtime.profile import train_rate


def measure(model_spec: str, num_ranks: int, args) -> dict:
    """One configuration, measured by the profile's own `train_rate` (engine/runtime/profile.py)."""
    return train_rate(model_spec, num_ranks, steps=args.steps, num_trajectories=args.num_trajectories,
                      seq_len=args.seq_len, micro_batch_tokens=args.micro_batch_tokens,
                      threads_per_rank=args.threads_per_rank, timeout_s=args.timeout_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny, smollm2, or local HF dirs")
    parser.add_argument("--steps", type=int, default=2, help="timed train steps per configuration")
    parser.add_argument("--num-trajectories", type=int, default=8, help="trajectories per step (groups of 4)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per trajectory, half of them prompt")
    parser.add_argument("--micro-batch-tokens", type=int, default=512, help="padded tokens per forward/backward")
    parser.add_argument("--threads-per-rank", type=int, default=1, help="torch threads in each rank")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per configuration")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

    rows, ratio = [], float("nan")
    for spec in args.models.split(","):
        per_ranks = {n: measure(spec, n, args) for n in (1, 2)}
        ratio = per_ranks[2]["tokens_per_s"] / per_ranks[1]["tokens_per_s"]
        for n, r in per_ranks.items():
            rows.append((spec, r["params"], n, r["tokens_per_s"], r["elapsed_s"], r["loss"], ratio if n == 2 else 1.0))
    print(f"{'model':<10} {'params':>11} {'ranks':>5} {'tokens/s':>10} {'time_s':>8} {'loss':>9} {'vs 1 rank':>9}")
    for spec, params, n, tps, secs, loss, rel in rows:
        print(f"{spec:<10} {params:>11,} {n:>5} {tps:>10.1f} {secs:>8.2f} {loss:>9.4f} {rel:>9.2f}")
    print(f"batch: {args.num_trajectories} trajectories x {args.seq_len} tokens, {args.steps} timed steps, "
          f"micro_batch_tokens={args.micro_batch_tokens}, {args.threads_per_rank} thread(s) per rank, {os.cpu_count()} cores")
    print(f"trainer_fsdp2_vs_1: {ratio:.2f}")


if __name__ == "__main__":
    main()
