"""Checks of a run's inputs made in the launcher before any rank starts or any file is written.

A mistake the user can fix (a run directory that cannot be created, a plug-in that does not
import) must end as one line naming the value and the fix, and must leave no half-created run
directory behind: so these checks only read, and probe writability with a temporary entry
that they remove again. Torch-free, so the simulator path (`--sim`) runs them too.

Invariants (tests/test_bad_input.py, tests/test_plugins.py): `--out` under a file or in a
read-only place is a ValueError naming the path and the fix, and creates nothing; a writable
path passes; a broken `--env`/`--reward` fails here, before the run dir exists.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def check_run_inputs(cfg, run_dir: Path) -> None:
    """Every launcher-side check of a resolved config, before the run directory exists."""
    check_out_dir(run_dir, "--resume" if cfg.run.resume else "--out")
    if cfg.run.env or cfg.run.reward:
        check_plugin_flags(cfg)


def check_plugin_flags(cfg) -> None:
    """`--env` / `--reward`: compatible with the other flags, importable, and well-formed (envs/plugins.py)."""
    from envs.plugins import check_plugins

    used = " and ".join(f for f, v in (("--env", cfg.run.env), ("--reward", cfg.run.reward)) if v)
    if cfg.run.sim:
        raise ValueError(f"{used} cannot be simulated: --sim models the built-in benches' workloads; drop --sim or {used}")
    if cfg.run.env and cfg.run.demo_turns > 0:
        raise ValueError(f"--demo-turns {cfg.run.demo_turns} needs a bench's scripted oracle, which --env {cfg.run.env!r} "
                         "does not have; pass --demo-turns 0")
    check_plugins(cfg.run.bench, env_spec=cfg.run.env, reward_spec=cfg.run.reward, **run_env_kwargs(cfg))


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
