"""The discrete-event cluster simulator: the same step core, routers and planner as a real run. No torch.

What lives here: `config` (SimConfig, and which of libra.py's flags reach it under --sim),
`workload` (long-tailed, drifting synthetic trajectories; env profiles), `trace` (recorded runs
as workloads, fidelity replay), `instance` (continuous batching as a fluid of decode
iterations), `cluster` (the event loop around `steps.core`: rollout, tools, router, trainer,
sync, planner), `oracle` (the clairvoyant router), `reward` (the reward-vs-steps model, priced
by the measured staleness), `baselines` (each peer tuned to its best), `run` (simulate and
compare entry points).

May import: scheduler, steps, runlog
Must not import: torch, engine, envs, bench.
"""
