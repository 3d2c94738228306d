"""Checks of a run's inputs made in the launcher before any rank starts or any file is written.

A mistake the user can fix (a run directory that cannot be created, a plug-in that does not
import) must end as one line naming the value and the fix, and must leave no half-created run
directory behind: so these checks only read, and probe writability with a temporary entry
that they remove again. Torch-free, so the simulator path (`--sim`) runs them too.

Invariants (tests/test_bad_input.py): `--out` under a file or in a read-only place is a
ValueError naming the path and the fix, and creates nothing; a writable path passes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def check_run_inputs(cfg, run_dir: Path) -> None:
    """Every launcher-side check of a resolved config, before the run directory exists."""
    check_out_dir(run_dir, "--resume" if cfg.run.resume else "--out")


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
