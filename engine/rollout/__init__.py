"""Rollout: many multi-turn trajectories at once, with tool calls off the decode loop.

What lives here: `engine` (RolloutEngine: the turn logic), `runner` (the batched KV side),
`kv_cache`, `cpu_linear` (oneDNN linears on CPU), `tp` (tensor-parallel instances), `api` (its
config, requests and events; torch-free, read by the config layer), and the vLLM backend
(`vllm_engine`, `vllm_script`).

May import: engine, envs, scheduler
Must not import: engine.trainer, engine.runtime (rollout and trainer never import each other;
the runtime composes them), sim, steps, bench.
"""
