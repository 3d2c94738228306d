"""Presets of the paper's experiments, as `SimConfig`s (the simulator's side of config presets).

- `default_sim(bench)`: what `python libra.py --bench B --sim [--compare]` runs: 16 x A800,
  Qwen3-14B, 10 steps of 16 prompts x 8 samples; every system together in well under a minute
  on two CPU cores.
- `paper_a800_48(bench)`: the paper's main testbed, 48 x A800 80GB with Qwen3-14B on the swe
  (R2E-Gym), search (Search-R1) and math (DAPO-Math) workloads; 32 prompts x 8 samples.
- `paper_910b3_160(bench)`: the later version's 160 x Ascend 910B3 NPUs, Qwen3-14B, 64 x 8.
- `ablation(bench)`: the 48 x A800 setup; run it with `ABLATION_SYSTEMS`.
- `scale_1024()`: 1,024 devices, 100 steps: the simulator-speed benchmark.
- scenarios the scheduler must handle (`SCENARIOS`, run together by `python -m bench.sim_compare
  --scenarios`): `training_heavy` (the planner must give training devices), `zero_tail` (no
  tail: C-MLFQ has nothing to exploit), `heavy_tail` (a lognormal tail twice as wide in log space
  as the default), `pareto_tail` (a power-law tail, p99/median ~26x), `length_drift` (training
  heavy at first, then trajectories grow 4x: the planner moves devices to training, then back),
  `throughput_bound` (64 trajectories per device a step: where small-TP throughput and a
  high-TP lane for the tail should both pay).

Batch sizes and step counts are ours (the paper's exact batch sizes are not reproduced); the
workloads' tails follow its p99 ~10x median figure (see sim/workload.py).
"""

from __future__ import annotations

from sim.config import SimConfig, default_sim
from sim.workload import TAIL_SIGMA_P99_10X

ABLATION_SYSTEMS = ["libra", "libra-no-design", "libra-no-planner", "libra-no-realloc", "libra-no-cmlfq", "libra-homogeneous",
                    "libra-no-elastic", "oracle"]


def paper_a800_48(bench: str = "swe", seed: int = 0) -> SimConfig:
    return SimConfig(bench=bench, hardware="a800", model="qwen3-14b", num_devices=48, steps=20,
                     prompts_per_step=32, samples_per_prompt=8, dataset_prompts=128, seed=seed)


def paper_910b3_160(bench: str = "swe", seed: int = 0) -> SimConfig:
    return SimConfig(bench=bench, hardware="910b3", model="qwen3-14b", num_devices=160, steps=20,
                     prompts_per_step=64, samples_per_prompt=8, dataset_prompts=256, seed=seed)


def ablation(bench: str = "swe", seed: int = 0) -> SimConfig:
    return paper_a800_48(bench, seed)


def scale_1024(bench: str = "swe", seed: int = 0) -> SimConfig:
    return SimConfig(bench=bench, hardware="h100", model="qwen3-14b", num_devices=1024, steps=100,
                     prompts_per_step=128, samples_per_prompt=8, dataset_prompts=1024, seed=seed)


def training_heavy(bench: str = "math", seed: int = 0) -> SimConfig:
    """Short trajectories and four trainer passes per batch: training dominates the step."""
    return SimConfig(bench=bench, num_devices=16, steps=8, prompts_per_step=16, samples_per_prompt=8, train_epochs=4,
                     seed=seed, workload_overrides=(("base_turn_tokens", 256.0), ("tail_sigma", 0.0), ("drift", 0.0)))


def zero_tail(bench: str = "swe", seed: int = 0) -> SimConfig:
    """Every trajectory identical (no tail, no jitter, fixed tool latency)."""
    return SimConfig(bench=bench, num_devices=16, steps=6, prompts_per_step=16, samples_per_prompt=8, seed=seed,
                     workload_overrides=(("tail_sigma", 0.0), ("turn_jitter", 0.0), ("tool_latency_sigma", 0.0),
                                         ("drift", 0.0)))


def heavy_tail(bench: str = "swe", seed: int = 0) -> SimConfig:
    """A tail twice as wide (in log space) as the default p99 ~10x median."""
    return SimConfig(bench=bench, num_devices=16, steps=6, prompts_per_step=16, samples_per_prompt=8, seed=seed,
                     workload_overrides=(("tail_sigma", 1.5 * TAIL_SIGMA_P99_10X), ("drift", 0.0)))


def pareto_tail(bench: str = "swe", seed: int = 0) -> SimConfig:
    """A Pareto(1.2) tail: the longest trajectories are far longer than any lognormal's."""
    return SimConfig(bench=bench, num_devices=16, steps=6, prompts_per_step=16, samples_per_prompt=8, seed=seed,
                     workload_overrides=(("tail_shape", "pareto"), ("tail_alpha", 1.2), ("drift", 0.0)))


def length_drift(bench: str = "swe", seed: int = 0) -> SimConfig:
    """Four trainer passes make the first steps training-bound; lengths then grow 4x over the run."""
    return SimConfig(bench=bench, num_devices=16, steps=12, prompts_per_step=16, samples_per_prompt=8, train_epochs=4,
                     seed=seed, workload_overrides=(("drift", 3.0),))


def throughput_bound(bench: str = "swe", seed: int = 0) -> SimConfig:
    """64 trajectories per device a step (1,024 on 16 devices): decode batches are large, so TP1
    instances out-decode TP8 per device, while the default tail still wants a fast lane."""
    return SimConfig(bench=bench, num_devices=16, steps=8, prompts_per_step=64, samples_per_prompt=16, seed=seed,
                     workload_overrides=(("drift", 0.0),))


SCENARIOS = ("training_heavy", "zero_tail", "heavy_tail", "pareto_tail", "length_drift", "throughput_bound")

PRESETS = {
    "default": default_sim,
    "paper_a800_48": paper_a800_48,
    "paper_910b3_160": paper_910b3_160,
    "ablation": ablation,
    "scale_1024": scale_1024,
    "training_heavy": training_heavy,
    "zero_tail": zero_tail,
    "heavy_tail": heavy_tail,
    "pareto_tail": pareto_tail,
    "length_drift": length_drift,
    "throughput_bound": throughput_bound,
}


def get_preset(name: str, bench: str = "swe", seed: int = 0) -> SimConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown sim preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name](bench, seed)
