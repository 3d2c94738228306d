"""`SimConfig`: the one frozen config of a simulated run (workload, cluster, model, schedule).

`python libra.py --bench B --sim` runs `from_libra_config`: `default_sim(B, seed)` with every
flag given that means something in the simulator on top (`SIM_FLAGS`; any field of the planner,
router and buckets sections, over the simulator's own defaults for them). A flag with no
simulator meaning (trainer, launch, sync, env, the device, the rollout's sampling, ...) is a
ValueError naming it, never silently ignored. The presets of the paper's experiments live in
`bench/presets.py`.

Invariants (tests/sim/test_sim_config.py): every bad value raises ValueError naming the field, the
value and the fix; `to_dict()` is JSON-safe and lists every field; a flag with a simulator
meaning reaches the SimConfig, one without is refused by name.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

from scheduler.costmodel import HARDWARE, MODELS
from scheduler.layout import MAX_SEQS_PER_INSTANCE, BucketsConfig
from scheduler.planner import PlannerConfig
from scheduler.prefix_tree import PrefixTreeConfig
from scheduler.routers import RouterConfig
from sim.reward import MEASURED_LAG_GAMMA
from sim.workload import PROFILES, get_profile

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
    # the planner's settings; its max_batch is max_seqs_per_instance and its profile is not read (`profile` is)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    router: RouterConfig | None = None  # None: `default_router` (the C-MLFQ tree rebuilt about once a step)
    buckets: BucketsConfig | None = None  # None: the workload profile's bucket limits (`buckets_of`)

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


def default_router(cfg: SimConfig) -> RouterConfig:
    """The routers' settings when the config names none: C-MLFQ's tree rebuild is O(window x turns), and at
    cluster scale rebuilding every 64 finishes would dominate the host time, so it rebuilds about once per step."""
    return RouterConfig(tree=PrefixTreeConfig(rebuild_every=max(64, cfg.trajectories_per_step)))


def buckets_of(cfg: SimConfig) -> BucketsConfig:
    """The config's buckets, else the ones a user would set for the workload (its profile's limits), else the defaults."""
    if cfg.buckets is not None:
        return cfg.buckets
    if cfg.trace_dir is not None or (cfg.bench not in PROFILES and not cfg.bench.endswith(".json")):
        return BucketsConfig()
    return BucketsConfig(max_tokens=get_profile(cfg.bench, **dict(cfg.workload_overrides)).bucket_max_tokens)


# ---- libra.py's flags under --sim (dotted config keys, as config.given_keys names them) -------------
SIM_ENTRY_FLAGS = ("run.sim", "run.bench", "run.seed", "run.system", "run.compare", "run.compare_systems", "run.out")
SIM_FLAGS = {  # flag -> the SimConfig field it sets
    "run.steps": "steps", "run.nproc": "num_devices", "run.model": "model",
    "step.prompts_per_step": "prompts_per_step", "step.samples_per_prompt": "samples_per_prompt",
    "step.max_staleness": "max_staleness", "rollout.max_batch": "max_seqs_per_instance", "planner.profile": "profile",
}
SIM_SECTIONS = ("planner", "router", "buckets")  # every other field of these sections sets the SimConfig's own


def _flag(key: str) -> str:
    return "--" + key.removeprefix("run.").replace("_", "-")


def _replaced(obj, path: list[str], value):
    if len(path) == 1:
        return dataclasses.replace(obj, **{path[0]: value})
    return dataclasses.replace(obj, **{path[0]: _replaced(getattr(obj, path[0]), path[1:], value)})


def from_libra_config(cfg, given=()) -> SimConfig:
    """The SimConfig of `python libra.py --sim ...` (module docstring): `cfg` is the parsed LibraConfig,
    `given` the dotted keys of the flags on its command line (the preset's values are not the user's)."""
    given = set(given)
    refused = sorted(k for k in given if k not in SIM_ENTRY_FLAGS and k not in SIM_FLAGS and k.split(".")[0] not in SIM_SECTIONS)
    if refused:
        takes = sorted(_flag(k) for k in (*SIM_ENTRY_FLAGS, *SIM_FLAGS)) + [f"--{s}.*" for s in SIM_SECTIONS]
        raise ValueError(f"--sim: {', '.join(_flag(k) for k in refused)} {'means' if len(refused) == 1 else 'mean'} nothing in the simulator (it plays a "
                         f"modelled cluster: no trainer, launcher, env or local device); drop them. It takes {', '.join(takes)}")
    value = {k: functools.reduce(getattr, k.split("."), cfg) for k in given if k.split(".")[0] != "run" or k in SIM_FLAGS}
    kw = {SIM_FLAGS[k]: v for k, v in value.items() if k in SIM_FLAGS}
    if kw.get("num_devices") == 0:  # --nproc 0: the default
        del kw["num_devices"]
    profile = kw.pop("profile", "none")
    if profile in ("auto", "refresh"):
        raise ValueError(f"--sim: --planner.profile {profile} measures this machine, but the simulator plays the cluster of "
                         "its hardware and model tables; pass a profile file (python -m bench.profile) or none")
    if profile not in ("none", ""):
        kw["profile"] = profile
    try:
        sim = default_sim(cfg.run.bench, seed=cfg.run.seed).replace(**kw)
        for section, base in (("planner", sim.planner), ("router", default_router(sim)), ("buckets", buckets_of(sim))):
            keys = sorted(k for k in value if k.split(".")[0] == section and k not in SIM_FLAGS)
            if keys:
                sim = sim.replace(**{section: functools.reduce(lambda o, k: _replaced(o, k.split(".")[1:], value[k]), keys, base)})
    except ValueError as exc:
        raise ValueError(f"--sim: {exc}") from None
    return sim
