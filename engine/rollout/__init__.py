"""Rollout: many multi-turn trajectories at once, with tool calls off the decode loop.

What lives here: `turns` (TurnEngine: the turn logic every backend shares), `backend` (the
`DecodeBackend` protocol it drives), `engine` (RolloutEngine: the turn logic over the torch
`BatchRunner`), `runner` (the batched KV side and the sampling), `kv_cache`, `cpu_linear` (oneDNN
linears on CPU), `tp` (tensor-parallel instances), `api` (its config, requests, events and request
phases; torch-free, read by the config layer), and the vLLM backend (`vllm_engine`: VllmRunner and
VllmRolloutEngine; `vllm_script`).

May import: engine, envs, scheduler
Must not import: engine.trainer, engine.runtime (rollout and trainer never import each other;
the runtime composes them), sim, steps, bench.
"""
