"""Discrete-event cluster simulator driving the same scheduler/ classes. No torch.

Modules: `config` (SimConfig), `workload` (long-tailed, drifting synthetic trajectories; env
profiles), `trace` (recorded runs as workloads; fidelity replay), `instance` (continuous batching
as a fluid of decode iterations), `cluster` (the event loop: rollout, tools, router, trainer,
sync, planner), `oracle` (clairvoyant router), `reward` (the reward-vs-steps MODEL), `report`
(DESIGN.md metrics/summary, the table), `plot` (compare.png), `run` (simulate/compare entry points).
"""
