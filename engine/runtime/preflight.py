"""Checks of a run's inputs made in the launcher before any rank starts or any file is written.

A mistake the user can fix (a run directory that cannot be created, a plug-in that does not
import, a sandbox that cannot run our interpreter, a model directory without weights) must end
as one line naming the value and the fix, and must leave no half-created run directory behind:
a failure inside a rank would come back with its traceback (engine/runtime/launch.py). So, in order:
  1. `--out`/`--resume` is, or can be created as, a writable dir (probed with a temporary entry),
     and a `--resume` dir holds a complete checkpoint;
  2. the run's env is built once as rank 0 will build it, then closed: the bench's (its sandbox
     probes namespaces and runs our interpreter, `--data` loads, the level has tasks) or the
     `--env`/`--reward` plug-ins; its sandboxes warn nothing here (the rank's do);
  3. the model: config, weight files, tokenizer (engine/models.py `check_model`), no tensor loaded;
     `--rollout.dtype bfloat16` on a CPU without bf16 matmul;
     with `--rollout.backend vllm`, that vLLM imports and runs this model (engine/rollout/vllm_engine.py `check_backend`).
Nothing is written under the run dir (the env's sandbox makes and removes its own work dirs). The
simulator (`--sim`) builds no env and loads no model: it runs only 1, without torch.

Invariants (tests/engine/runtime/test_bad_input.py, tests/envs/test_plugins.py, tests/engine/runtime/test_startup_errors.py): `--out`
under a file or in a read-only place is a ValueError naming the path and the fix, and creates
nothing; a writable path passes; a broken `--env`/`--reward`, a sandbox that cannot run the
interpreter and a broken model dir fail here, each as one line, before the run dir exists.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def check_run_inputs(cfg, run_dir: Path) -> None:
    """Every launcher-side check of a resolved config, before the run directory exists."""
    check_out_dir(run_dir, "--resume" if cfg.run.resume else "--out")
    if cfg.run.resume and not cfg.run.sim:
        check_resume(run_dir)
    if cfg.run.env or cfg.run.reward:
        check_plugin_flags(cfg)  # builds the run's env (and refuses --sim)
    elif not cfg.run.sim:
        check_bench_env(cfg)
    if not cfg.run.sim:
        from engine.models import check_model

        check_model(cfg.run.model)
        check_rollout_engine(cfg)


def check_rollout_engine(cfg) -> None:
    """`--rollout.dtype bfloat16` on a CPU with bf16 matmul; `--rollout.backend vllm` where vLLM runs this model."""
    if cfg.rollout.dtype != "bfloat16" and cfg.rollout.backend != "vllm":
        return
    from engine.devices import detect

    kind = detect(cfg.run.device).kind
    if cfg.rollout.dtype == "bfloat16":
        from engine.precision import precision_for

        precision_for(kind, cfg.rollout.dtype)  # refused on a CPU without bf16 matmul
    if cfg.rollout.backend == "vllm":
        from engine.rollout.vllm_engine import check_backend

        check_backend(cfg, kind)  # vLLM imports (else: the set-up command), the model's layout fits it


def check_resume(run_dir: Path) -> None:
    """`--resume DIR`: DIR holds a complete checkpoint (its config.json was read by config.parse_args)."""
    from engine.runtime import checkpoint

    if checkpoint.latest(run_dir) is None:
        raise FileNotFoundError(f"--resume {run_dir}: no complete checkpoint under {Path(run_dir) / 'ckpt'}/ (a run writes "
                                "one at a stop, at its end, every --step.checkpoint-every-min minutes and every "
                                "--step.checkpoint-every steps); run it again with --out instead")


def check_bench_env(cfg) -> None:
    """Build the bench's env once, as rank 0 will (its sandbox runs our interpreter; `--data` loads), and
    check it has tasks."""
    from envs.plugins import make_run_env
    from envs.sandbox.sandbox import start_up_check

    with start_up_check():
        env = make_run_env(cfg.run.bench, **run_env_kwargs(cfg))
        try:
            if not env.tasks():
                raise ValueError(f"--bench {cfg.run.bench} with level={cfg.run.level} gave no tasks; pick another level")
        finally:
            env.close()


def check_plugin_flags(cfg) -> None:
    """`--env` / `--reward`: compatible with the other flags, importable, and well-formed (envs/plugins.py)."""
    from envs.plugins import check_plugins

    used = " and ".join(f for f, v in (("--env", cfg.run.env), ("--reward", cfg.run.reward)) if v)
    if cfg.run.sim:
        raise ValueError(f"{used} cannot be simulated: --sim models the built-in benches' workloads; drop --sim or {used}")
    from envs.sandbox.sandbox import start_up_check

    with start_up_check():
        check_plugins(cfg.run.bench, env_spec=cfg.run.env, reward_spec=cfg.run.reward, demo_turns=cfg.run.demo_turns,
                      **run_env_kwargs(cfg))


def run_env_kwargs(cfg) -> dict:
    """The keyword arguments every env of this run is built with (the run's env and the preflight one)."""
    return dict(seed=cfg.run.seed, num_tasks=cfg.run.num_tasks or None, data_path=cfg.run.data or None,
                level=None if cfg.run.level < 0 else cfg.run.level, env_cfg=cfg.env)


def check_out_dir(path: Path, flag: str = "--out") -> None:
    """Raise ValueError unless `path` is, or can be created as, a writable directory."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a file, not a directory; pass a new or existing directory path")
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{flag} {str(path)!r} cannot be created: {str(existing)!r} is a file; "
                         "pass a path whose parents are directories")
    try:
        probe = tempfile.mkdtemp(prefix=".libra-probe-", dir=existing)
    except OSError as exc:
        raise ValueError(f"{flag} {str(path)!r} cannot be created: {str(existing)!r} is not writable "
                         f"({exc.strerror}); pass a directory you can write to, e.g. --out runs/my-run") from None
    os.rmdir(probe)
