"""One config for a Libra run: frozen per-subsystem dataclasses, CLI flags generated from them.

`LibraConfig` composes the sub-configs; each subsystem gets only its own section (the router
never sees the trainer's learning rate). Sections owned by other packages (rollout, trainer,
buckets, router, planner) are defined next to their code, in torch-free modules, and imported
here: parsing flags, `--help` and `--sim` never import torch.

CLI: the run section's fields are top-level flags (`--bench swe --steps 5`); every other field is
`--SECTION.FIELD` (`--rollout.max-turns 6`, `--router.tree.window 300`); tuples are given
comma-separated. Flags override the preset chosen for the bench and device (`preset_for`), so
defaults stay sane on a 2-core CPU and on an 8-GPU node.

Invariants (tests/test_config.py): every field has a flag; parsing the flags of a config's
`to_flat()` reproduces it; bad values raise ValueError naming the flag and the fix; the resolved
config round-trips through config.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from engine.rollout.api import RolloutConfig
from engine.trainer.config import TrainerConfig
from envs.config import EnvConfig
from loggers import check_loggers
from envs.registry import BENCHES
from scheduler.design import design_lag_cap
from scheduler.layout import BucketsConfig
from scheduler.planner import PlannerConfig
from scheduler.routers import RouterConfig, cpu_router_config
from scheduler.systems import SYSTEMS
# Fields set from another section so the two can never disagree; they get no flag of their own.
DERIVED = {"trainer.max_staleness": "step.max_staleness", "trainer.temperature": "rollout.temperature",
           "trainer.max_tokens": "rollout.max_total_tokens", "planner.max_batch": "rollout.max_batch"}


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    bench: str = "swe"  # workload: swe | search | math | toy
    system: str = "libra"  # system to run (see --help epilog): libra, colocate, static, ...
    model: str = "smollm2"  # smollm2 (packaged SmolLM2-135M) | tiny (random, tests) | a local HF model dir
    device: str = "auto"  # auto | cpu | cuda | npu
    nproc: int = 0  # worker ranks; 0 = one per GPU/NPU, or 4 on CPU
    steps: int = 3  # training steps (policy updates)
    seed: int = 0  # seeds tasks, sampling and model init
    out: str = ""  # run directory; empty = runs/<bench>-<system>-<time>
    num_tasks: int = 0  # tasks to draw from the bench; 0 = all
    level: int = -1  # bench difficulty level to keep (-1 = all levels)
    data: str = ""  # local parquet/jsonl in the verl row schema instead of the generated tasks
    env: str = ""  # your own env instead of the bench's, as module.path:Class (envs/plugins.py)
    reward: str = ""  # your own reward, module.path:function(final_text, ground_truth, task) -> float
    demo_turns: int = -1  # solved example exchanges shown before each task (envs/demo.py); -1 = 1 for smollm2, else 0
    sim: bool = False  # run the cluster simulator instead of real ranks; it takes the flags that mean something there (sim/config.py) and refuses the others
    compare: bool = False  # run every system on the same tasks and seed, write compare.json/png
    compare_systems: tuple[str, ...] = ()  # systems for --compare (comma-separated); empty = all real systems
    plan_only: bool = False  # print the placement (ranks, roles, buckets, devices) and exit
    resume: str = ""  # run directory to resume from its newest complete checkpoint
    loggers: tuple[str, ...] = ("console", "jsonl")  # comma-separated: console, jsonl (always on), tensorboard, wandb

    def __post_init__(self):
        if self.bench not in BENCHES:
            raise ValueError(f"--bench {self.bench!r} is not one of {BENCHES}")
        for name in (self.system, *self.compare_systems):
            if name not in SYSTEMS:
                raise ValueError(f"--system {name!r} is not one of {sorted(SYSTEMS)}")
        if self.device not in ("auto", "cpu", "cuda", "npu"):
            raise ValueError(f"--device {self.device!r} is not one of auto, cpu, cuda, npu")
        if self.nproc < 0 or self.nproc == 1:
            raise ValueError(f"--nproc {self.nproc}: Libra needs >= 2 worker ranks (one trainer, one rollout); pass 2 or more, or 0 for the default")
        if self.steps < 1:
            raise ValueError(f"--steps {self.steps} must be >= 1")
        if self.num_tasks < 0:
            raise ValueError(f"--num-tasks {self.num_tasks} must be >= 0 (0 = all tasks)")
        if self.demo_turns < -1:
            raise ValueError(f"--demo-turns {self.demo_turns} must be >= 0, or -1 for the model's default")
        object.__setattr__(self, "loggers", check_loggers(self.loggers))


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    start_method: str = "forkserver"  # forkserver (fast, preloads torch) | spawn
    threads_per_rank: int = 1  # torch intra-op threads per rank (ranks share the cores)
    timeout_s: float = 120.0  # rendezvous, group creation and collective timeout
    rank_timeout_s: float = 600.0  # a rank silent (no heartbeat) this long is declared hung and the run stops
    straggler_s: float = 10.0  # a rank silent this long is named in the log (the run waits for it)
    stop_grace_s: float = 20.0  # on Ctrl-C/SIGTERM/SIGHUP: seconds the ranks get to checkpoint the last trained step before they are killed
    trainer_frac: float = 0.5  # share of the workers that train in the first layout (the planner moves it)

    def __post_init__(self):
        if self.start_method not in ("forkserver", "spawn"):
            raise ValueError(f"--launch.start-method {self.start_method!r} must be forkserver or spawn (fork deadlocks after torch used OpenMP)")
        if self.threads_per_rank < 1:
            raise ValueError(f"--launch.threads-per-rank {self.threads_per_rank} must be >= 1")
        if not 0 < self.trainer_frac < 1:
            raise ValueError(f"--launch.trainer-frac {self.trainer_frac} must be in (0, 1): both training and rollout need ranks")
        if self.timeout_s <= 0 or self.rank_timeout_s <= 0 or self.straggler_s <= 0 or self.stop_grace_s < 0:
            raise ValueError(f"--launch timeouts ({self.timeout_s}, {self.rank_timeout_s}, {self.straggler_s}) must be > 0 seconds and "
                             f"--launch.stop-grace-s {self.stop_grace_s} >= 0")


@dataclass(frozen=True, kw_only=True)
class SyncConfig:
    bucket_size_mb: float = 64.0  # weight-transfer bucket size (one broadcast per bucket)

    def __post_init__(self):
        if self.bucket_size_mb <= 0:
            raise ValueError(f"--sync.bucket-size-mb {self.bucket_size_mb} must be > 0; 32-256 suits most links")


@dataclass(frozen=True, kw_only=True)
class StepConfig:
    prompts_per_step: int = 4  # distinct tasks per training step
    samples_per_prompt: int = 4  # GRPO group size n
    max_staleness: int = 1  # trajectories at most this many policy versions old are trained on
    checkpoint_every: int = 0  # steps between checkpoints (0 = not by steps)
    checkpoint_every_min: float = 10.0  # minutes of run time between checkpoints (0 = not by time); the end always writes one
    keep_checkpoints: int = 2  # newest complete checkpoints kept in RUN/ckpt (0 = keep all)
    trajectories_logged_per_step: int = 2  # sample of trajectories written to trajectories_sample.jsonl

    def __post_init__(self):
        if self.prompts_per_step < 1 or self.samples_per_prompt < 2:
            raise ValueError(
                f"--step.prompts-per-step {self.prompts_per_step} must be >= 1 and --step.samples-per-prompt "
                f"{self.samples_per_prompt} >= 2 (GRPO compares samples within a group)"
            )
        if self.max_staleness < 0 or self.checkpoint_every < 0 or self.checkpoint_every_min < 0 or self.keep_checkpoints < 0:
            raise ValueError(f"--step.max-staleness {self.max_staleness}, --step.checkpoint-every {self.checkpoint_every}, "
                             f"--step.checkpoint-every-min {self.checkpoint_every_min} and --step.keep-checkpoints "
                             f"{self.keep_checkpoints} must be >= 0")


@dataclass(frozen=True, kw_only=True)
class LibraConfig:
    run: RunConfig = field(default_factory=RunConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    step: StepConfig = field(default_factory=StepConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    buckets: BucketsConfig = field(default_factory=BucketsConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    env: EnvConfig = field(default_factory=EnvConfig)  # sandbox of every bench's tools (--env.isolation ...)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))


# ---- presets -------------------------------------------------------------------------------
def preset_for(run: RunConfig, device_kind: str) -> LibraConfig:
    """Defaults that suit the device and the system; a flag overrides any of them.

    The trainer trains stale tokens as the system's own users do (`SystemSpec.off_policy`: verl's
    bypass for verl-async, AReaL's decoupled objective for the others).
    """
    cfg = _device_preset(run, device_kind)
    spec = SYSTEMS.get(run.system)
    if spec is None:
        return cfg
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, off_policy=spec.off_policy))


def _device_preset(run: RunConfig, device_kind: str) -> LibraConfig:
    """Defaults that suit the device: a short CPU run that ends in minutes, paper-like on GPUs.

    On CPU, training SmolLM2-135M runs at ~30-60 tokens/s (compute-bound on 2 cores, and FSDP
    over CPU ranks does not speed it up), so a step trains 4 trajectories of ~1.5k tokens on one
    trainer rank while three rollout ranks serve the short and long buckets; swe starts at level
    0, where the issue text shows the fix, so a 135M policy can earn reward at all.
    """
    if device_kind == "cpu":
        tiny = run.model == "tiny"
        if run.bench == "swe" and run.level < 0 and not tiny and not run.data:
            run = dataclasses.replace(run, level=0)
        return LibraConfig(
            run=run,
            step=StepConfig(prompts_per_step=2, samples_per_prompt=2),
            # a real policy samples cooler so a 135M model still writes well-formed tool calls; its swe
            # calls quote code (75 tokens median, 109 p90 with SmolLM2's tokenizer) after a ~1.2k-token
            # prompt (tools block + one demonstration)
            rollout=RolloutConfig(max_new_tokens_per_turn=64 if tiny else 128, max_turns=3,
                                  max_total_tokens=1536 if tiny else 2048, max_batch=32,
                                  temperature=1.0 if tiny else 0.7, top_p=1.0 if tiny else 0.95, tool_timeout_s=20.0),
            # 1k-token micro-batches: a SmolLM2 step then adds ~3.3 GB at its peak on CPU (bench.trainer_memory)
            trainer=TrainerConfig(lr=1e-3 if tiny else 1e-5, micro_batch_tokens=1024),
            # SmolLM2 swe prompts are ~1.1-1.3k tokens: the short bucket keeps what ends soon after one call
            buckets=BucketsConfig(max_tokens=(1024, 1536) if tiny else (1400, 2048)),
            router=cpu_router_config(),
            launch=LaunchConfig(trainer_frac=0.25),
            # a CPU run is a few steps of 4 trajectories: plan on the first step's lengths (after two
            # steps a 3-step run had no step left for a switch to pay back in, so it never moved).
            # TP1 only: on shared CPU cores a TP group adds gloo traffic and no speed
            # (measured: libra with a TP2 bucket ran at 0.4x static on the tiny model)
            planner=PlannerConfig(min_history_trajectories=4, allowed_tp=(1,)),
        )
    return LibraConfig(
        run=run,
        step=StepConfig(prompts_per_step=16, samples_per_prompt=8),
        rollout=RolloutConfig(max_new_tokens_per_turn=1024, max_turns=16, max_total_tokens=16384),
        trainer=TrainerConfig(lr=1e-6, micro_batch_tokens=16384),
    )


# ---- CLI generation ------------------------------------------------------------------------
def _flag(path: str) -> str:
    return "--" + path.replace("_", "-")


def _fields(cls, prefix: str):
    """(dotted path, field, resolved type) for every leaf field, nested dataclasses flattened."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            yield from _fields(tp, path + ".")
        else:
            yield path, f, tp


def _parser_for(tp):
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        base = _parser_for(inner[0])
        return lambda s: None if s.lower() in ("none", "null") else base(s)
    if origin is tuple:
        item = _parser_for(args[0])
        return lambda s: tuple(item(x) for x in s.split(",") if x != "")
    if tp is bool:
        def parse_bool(s: str) -> bool:
            if s.lower() in ("1", "true", "yes", "on"):
                return True
            if s.lower() in ("0", "false", "no", "off"):
                return False
            raise argparse.ArgumentTypeError(f"{s!r} is not a boolean; use true or false")
        return parse_bool
    return tp


def _help_of(cls, name: str) -> str:
    """The field's one-line comment, read from the source (the comment is the documentation)."""
    return _field_comments(cls).get(name, "")


@functools.cache
def _field_comments(cls) -> dict[str, str]:
    import inspect

    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out = {}
    for line in src.splitlines():
        head, sep, comment = line.strip().partition("#")
        if sep and ":" in head:
            out.setdefault(head.split(":", 1)[0].strip(), comment.strip())
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="libra.py",
        description="Libra: agentic RL post-training with heterogeneous rollout buckets (C-MLFQ) and a global resource planner.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="systems:\n" + "\n".join(f"  {n:18s} {s.description}" for n, s in SYSTEMS.items())
        + "\n\nexamples:\n  python libra.py --bench swe                      # real run, defaults for this machine"
        "\n  python libra.py --bench swe --plan-only          # print the placement and exit"
        "\n  python libra.py --bench swe --sim --compare      # simulate every system at cluster scale"
        "\n  python libra.py --bench math --model /ckpt/Qwen3-4B --nproc 8 --steps 50"
        "\n  python libra.py --resume runs/swe-libra-...      # continue a stopped run from its newest checkpoint"
        "\n  python libra.py export runs/swe-libra-... --to DIR  # the trained policy as a Hugging Face directory"
        " (libra.py export --help)",
        argument_default=argparse.SUPPRESS,
    )
    for section in dataclasses.fields(LibraConfig):
        cls = typing.get_type_hints(LibraConfig)[section.name]
        group = p.add_argument_group(section.name)
        for path, f, tp in _fields(cls, ""):
            if f"{section.name}.{path}" in DERIVED:
                continue
            flag = _flag(path) if section.name == "run" else _flag(f"{section.name}.{path}")
            kind = "store_true" if section.name == "run" and tp is bool else None
            help_text = _help_of(cls, f.name) if "." not in path else ""
            # run flags are short (--steps); the dotted spelling (--run.steps) works too, unlisted
            spellings = [(flag, help_text)] + ([(_flag(f"run.{path}"), argparse.SUPPRESS)] if section.name == "run" else [])
            for spelling, text in spellings:
                if kind:
                    group.add_argument(spelling, action="store_true", dest=f"{section.name}.{path}", help=text)
                else:
                    group.add_argument(spelling, type=_parser_for(tp), dest=f"{section.name}.{path}",
                                       metavar=tp.__name__ if isinstance(tp, type) else "V", help=text)
    return p


def _replace_path(obj, path: list[str], value):
    if len(path) == 1:
        return dataclasses.replace(obj, **{path[0]: value})
    child = getattr(obj, path[0])
    return dataclasses.replace(obj, **{path[0]: _replace_path(child, path[1:], value)})


def parse_args(argv: list[str] | None, device_kind_of=None) -> LibraConfig:
    """Flags -> LibraConfig: run flags first, then the preset for the device, then the rest."""
    ns = vars(build_parser().parse_args(argv))
    run_kw = {k.split(".", 1)[1]: v for k, v in ns.items() if k.startswith("run.")}
    if run_kw.get("resume"):  # the resumed run's own config, with only the flags given now on top
        path = Path(run_kw["resume"]) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"--resume {run_kw['resume']}: no config.json there; pass the directory of a previous run")
        saved = load_config(path)
        run = dataclasses.replace(saved.run, **run_kw)
        cfg = dataclasses.replace(saved, run=run)
    else:
        run = RunConfig(**run_kw)
        # a simulation plays its own cluster: the local device is irrelevant, and probing it imports torch
        probe = device_kind_of and not run.sim
        kind = device_kind_of(run.device) if probe else ("cpu" if run.device in ("auto", "cpu") else run.device)
        cfg = preset_for(run, kind)
    for key, value in ns.items():
        if key.startswith("run."):
            continue
        try:
            cfg = _replace_path(cfg, key.split("."), value)
        except ValueError as exc:
            raise ValueError(f"{_flag(key)} {value!r}: {exc}") from None
    return _derive(cfg)


def given_keys(argv: list[str]) -> frozenset[str]:
    """The dotted keys (`run.steps`, `step.max_staleness`) of the flags given in `argv`: what the user set, as
    opposed to the preset (`--sim` takes these: sim/config.py `from_libra_config`)."""
    return frozenset(vars(build_parser().parse_args(argv)))


def for_system(cfg: LibraConfig, system: str) -> LibraConfig:
    """`cfg` run as `system` (a --compare member): its derived fields resolved again, and its trainer's
    stale-token objective its own users' unless this run's flags chose another."""
    trainer = cfg.trainer
    old, new = SYSTEMS.get(cfg.run.system), SYSTEMS[system]
    if old is None or trainer.off_policy == old.off_policy:
        trainer = dataclasses.replace(trainer, off_policy=new.off_policy)
    return _derive(dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, system=system, compare=False), trainer=trainer))


def _derive(cfg: LibraConfig) -> LibraConfig:
    """The trainer drops what the coordinator would call stale, scores log-probs at the rollout's temperature, and
    never trains a trajectory longer than the rollout's token budget; the planner prices the batch the engine runs.

    `--demo-turns -1` becomes 1 for SmolLM2 on generated bench tasks (they come with an oracle to
    demonstrate), 0 otherwise (`--data`, `--env`); here rather than in the presets so a resumed run resolves it too.
    """
    if cfg.run.demo_turns < 0:
        demo_turns = 1 if cfg.run.model == "smollm2" and not cfg.run.data and not cfg.run.env else 0
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, demo_turns=demo_turns))
    temperature = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0  # greedy: plain log-softmax
    # finish-order peers (AReaL-style) bound staleness at admission; a long group that spans more
    # updates is trained under the off-policy objective (decoupled by default: its behaviour weight,
    # capped), as AReaL trains it, so the trainer checks no bound. Libra's designs bound the trained lag,
    # finish-order ones included (steps/finish_order.py), at the design cap, which may exceed the run's bound
    spec = SYSTEMS.get(cfg.run.system)
    max_staleness = None if spec is not None and spec.batch_by_finish else cfg.step.max_staleness
    if spec is not None and spec.chooses_design:
        max_staleness = design_lag_cap(cfg.planner, cfg.step.max_staleness)
        if not cfg.planner.bound_trained_lag and cfg.planner.design in ("auto", "libra-partial"):
            max_staleness = None  # finish-order designs bound admission only: a long group trains later
    return dataclasses.replace(cfg, trainer=dataclasses.replace(
        cfg.trainer, max_staleness=max_staleness, temperature=temperature, max_tokens=cfg.rollout.max_total_tokens),
        planner=dataclasses.replace(cfg.planner, max_batch=cfg.rollout.max_batch))


def load_config(path: Path) -> LibraConfig:
    """Rebuild a config from config.json (for --resume)."""
    data = json.loads(Path(path).read_text())
    return _from_dict(LibraConfig, data)


def _from_dict(cls, data: dict):
    hints = typing.get_type_hints(cls)
    kw = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        tp, v = hints[f.name], data[f.name]
        if dataclasses.is_dataclass(tp):
            v = _from_dict(tp, v)
        elif typing.get_origin(tp) is tuple or (isinstance(v, list)):
            v = tuple(tuple(x) if isinstance(x, list) else x for x in v)
        kw[f.name] = v
    return cls(**kw)
