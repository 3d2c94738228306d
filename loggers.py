"""Metric loggers beside metrics.jsonl: console, TensorBoard and Weights & Biases (`--run.loggers`).

`metrics.jsonl` (runlog.RunWriter) is always written: it is the run's record in docs/design.md's
schema. The other loggers get the same step row with slash-path keys (`timing/step_s`,
`rollout/reward_mean`, `train/loss`, ...; `slash_metrics`), so a dashboard groups them the way
verl's and TRL's do. TensorBoard uses tensorboardX (or torch's writer when only `tensorboard` is
installed) and writes `RUN/tensorboard/`; wandb runs offline unless `WANDB_MODE` says otherwise or
`WANDB_API_KEY` is set, with its files under `RUN/wandb/` (`wandb sync RUN/wandb/offline-run-*`
uploads them later). A resumed run purges TensorBoard's steps after its checkpoint and logs them
again; wandb never takes a step twice, so a resumed run is a new wandb run of the same group,
named `RUN-resumed-N`. A missing package is a one-line error at start-up naming the pip command,
before the run directory exists. A logger that fails mid-run is reported once and dropped:
logging never stops training.

Invariants (tests/test_loggers.py): every docs/design.md step field maps to one slash key and extras
keep theirs; unknown logger names and missing packages are refused with the fix; jsonl is always
on; the TensorBoard logger writes an event file holding the slash keys; wandb offline writes its
run directory (skipped with the reason when wandb is not installed).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
SLASH_KEYS = {  # metrics.jsonl field -> the key dashboards show
    "step_s": "timing/step_s", "rollout_s": "timing/rollout_s", "train_s": "timing/train_s",
    "sync_s": "timing/sync_s", "reconfig_s": "timing/reconfig_s", "time_s": "timing/elapsed_s",
    "tokens": "rollout/tokens", "trajectories": "rollout/trajectories", "reward_mean": "rollout/reward_mean",
    "staleness_max": "rollout/staleness_max", "migrations": "rollout/migrations",
    "idle_frac_rollout": "rollout/idle_frac", "idle_frac_train": "train/idle_frac",
    "policy_version": "train/policy_version",
}
PACKAGES = {"tensorboard": (("tensorboardX", "tensorboard"), "pip install tensorboardX"),
            "wandb": (("wandb",), "pip install wandb")}


def check_loggers(names: tuple[str, ...]) -> tuple[str, ...]:
    """Validated logger names, jsonl always included; ValueError naming the fix otherwise."""
    unknown = [n for n in names if n not in LOGGERS]
    if unknown:
        raise ValueError(f"--run.loggers: unknown logger(s) {unknown}; choose from {','.join(LOGGERS)}")
    for name in names:
        if name in PACKAGES:
            modules, fix = PACKAGES[name]
            if not any(importlib.util.find_spec(m) for m in modules):
                raise ValueError(f"--run.loggers {name} needs the {' or '.join(modules)} package: {fix}, "
                                 f"or drop {name} from --run.loggers")
    return tuple(dict.fromkeys(("jsonl", *names)))


def slash_metrics(row: dict) -> dict[str, float]:
    """The numeric scalars of a metrics row under slash-path keys (extras such as train/loss keep theirs)."""
    out = {}
    for key, value in row.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if key in SLASH_KEYS:
            out[SLASH_KEYS[key]] = value
        elif "/" in key:
            out[key] = value
    out["rollout/tokens_per_s"] = row["tokens"] / max(row["step_s"], 1e-9)
    return out


class _TensorBoard:
    def __init__(self, out_dir: Path, config: dict, resume_step: int | None):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:  # only the `tensorboard` package: torch ships a writer for it
            from torch.utils.tensorboard import SummaryWriter
        # a resumed run purges what the stopped one logged after its checkpoint, then logs those steps again
        purge = {"purge_step": resume_step + 1} if resume_step is not None else {}
        self.writer = SummaryWriter(str(out_dir / "tensorboard"), **purge)
        self.writer.add_text("config", f"```\n{config}\n```", 0)

    def log(self, metrics: dict, step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    def __init__(self, out_dir: Path, config: dict, resume_step: int | None):
        import wandb

        out_dir.mkdir(parents=True, exist_ok=True)
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        # wandb never takes a step again: a resumed run is a new run of the same group, from step resume_step + 1
        name = out_dir.name if resume_step is None else f"{out_dir.name}-resumed-{resume_step}"
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "libra"), name=name, group=out_dir.name,
                              dir=str(out_dir), config=config, mode=mode, reinit="create_new")
        log.info("[libra] wandb %s run in %s", mode, self.run.dir)

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class MetricLoggers:
    """The optional loggers of one run (console and jsonl are written by the view and RunWriter)."""

    def __init__(self, names: tuple[str, ...], out_dir: Path, config: dict, resume_step: int | None = None):
        self.out = Path(out_dir)
        self.backends: dict[str, object] = {}
        for name, cls in (("tensorboard", _TensorBoard), ("wandb", _Wandb)):
            if name in names:
                self.backends[name] = cls(self.out, config, resume_step)

    def log(self, row: dict) -> None:
        metrics = slash_metrics(row)
        for name, backend in list(self.backends.items()):
            try:
                backend.log(metrics, row["step"])
            except Exception as exc:  # a dashboard failing must never stop training
                log.error("[libra] logger %s failed at step %s and is dropped (training goes on): %s", name, row["step"], exc)
                self.backends.pop(name)

    def close(self) -> None:
        for name, backend in self.backends.items():
            try:
                backend.close()
            except Exception as exc:
                log.error("[libra] closing logger %s failed: %s", name, exc)
        self.backends = {}
