"""`SimConfig`: the one frozen config of a simulated run (workload, cluster, model, schedule).

`default_sim` is what `python libra.py --bench B --sim` runs; the presets of the paper's
experiments live in `bench/presets.py`.

Invariants (tests/sim/test_sim_config.py): every bad value raises ValueError naming the field, the
value and the fix; `to_dict()` is JSON-safe and lists every field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from scheduler.costmodel import HARDWARE, MODELS
from scheduler.layout import MAX_SEQS_PER_INSTANCE
from sim.reward import MEASURED_LAG_GAMMA

KNOWN_HARDWARE = tuple(HARDWARE)
KNOWN_MODELS = tuple(MODELS)


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    bench: str = "swe"  # workload profile name (sim/workload.py PROFILES) or a label for a trace
    hardware: str = "a800"  # cost-model hardware entry
    model: str = "qwen3-14b"  # cost-model model entry
    num_devices: int = 16  # G: devices (GPUs/NPUs) in the simulated cluster
    steps: int = 12  # S: training steps to simulate
    prompts_per_step: int = 16  # prompts per training batch
    samples_per_prompt: int = 8  # n: GRPO group size
    max_staleness: int = 1  # policy versions a trajectory may lag behind (async systems only)
    max_seqs_per_instance: int = MAX_SEQS_PER_INSTANCE  # concurrent sequences per engine instance, any TP (vLLM's max_num_seqs; KV memory caps it too)
    dataset_prompts: int = 64  # distinct prompts in the dataset; they recur every epoch
    train_epochs: int = 1  # passes of the trainer over each batch (raises the training share)
    seed: int = 0  # seeds the workload; the same seed gives every system the same trajectories
    workload_overrides: tuple[tuple[str, float | str], ...] = ()  # (field, value) applied to the profile
    trace_dir: str | None = None  # replay trajectories.jsonl from this run dir instead of sampling
    profile: str | None = None  # a measured HardwareProfile (python -m bench.profile) instead of hardware/model
    # reward model: a trajectory trained k versions late is worth lag_gamma^k of a fresh one (sim/reward.py, measured)
    lag_gamma: float = MEASURED_LAG_GAMMA
    reward_target: float | None = None  # reward to reach for time-to-target; None = the model's 90% point

    def __post_init__(self) -> None:
        if self.hardware not in KNOWN_HARDWARE:
            raise ValueError(f"SimConfig.hardware={self.hardware!r} is unknown; pick one of {KNOWN_HARDWARE}")
        if self.model not in KNOWN_MODELS:
            raise ValueError(f"SimConfig.model={self.model!r} is unknown; pick one of {KNOWN_MODELS}")
        for name in ("num_devices", "steps", "prompts_per_step", "samples_per_prompt", "max_seqs_per_instance", "train_epochs",
                     "dataset_prompts"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"SimConfig.{name}={value} must be >= 1; give a positive count")
        if self.num_devices < 2:
            raise ValueError(
                f"SimConfig.num_devices={self.num_devices} must be >= 2 so that rollout and training each get a device"
            )
        if self.max_staleness < 0:
            raise ValueError(f"SimConfig.max_staleness={self.max_staleness} must be >= 0; 0 means on-policy")
        if not 0.0 < self.lag_gamma <= 1.0:
            raise ValueError(f"SimConfig.lag_gamma={self.lag_gamma} must lie in (0, 1]; it is the worth of a trajectory "
                             "one version late (1: staleness is free)")
        if self.reward_target is not None and not 0.0 < self.reward_target < 1.0:
            raise ValueError(f"SimConfig.reward_target={self.reward_target} must lie in (0, 1) or be None")

    @property
    def trajectories_per_step(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["workload_overrides"] = {k: v for k, v in self.workload_overrides}
        return d

    def replace(self, **changes) -> SimConfig:
        return dataclasses.replace(self, **changes)


def default_sim(bench: str = "swe", seed: int = 0) -> SimConfig:
    """16 x A800, Qwen3-14B, 10 steps of 16 prompts x 8 samples: every system in well under a minute."""
    return SimConfig(bench=bench, hardware="a800", model="qwen3-14b", num_devices=16, steps=10,
                     prompts_per_step=16, samples_per_prompt=8, seed=seed)
