"""The trainer: GRPO/PPO updates on the trainer group (FSDP2), exact on fresh and stale tokens.

What lives here: `trainer` (Trainer: micro-batches, the off-policy objective, non-finite
skips), `batch` (packing under the token budget), `algos` (pure tensor math: advantages,
losses), `config` (TrainerConfig; torch-free, read by the config layer).

May import: engine
Must not import: engine.rollout, engine.runtime (rollout and trainer never import each other),
envs, sim, steps, bench.
"""
