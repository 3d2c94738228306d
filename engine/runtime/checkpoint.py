"""Checkpoints of a run: trainer state + the coordinator's `RunState`, complete or absent.

Layout: `RUN/ckpt/step-000003/{trainer.pt, coordinator.json, COMPLETE}`. A checkpoint is
written into `RUN/ckpt/.tmp-step-000003/`, the completion marker last, then renamed into
place, so a run killed mid-write leaves only a temp dir that `latest()` ignores (a failed
write removes its own). The marker lists every file's size, and `latest()` skips, with a
warning, a checkpoint whose files are not those sizes (a file system that lost a file's tail).
Once the new one is in place, all but the newest `keep` complete checkpoints and any torn temp
dirs are removed.

The trainer state (model + optimizer, full unsharded tensors) is what a new trainer group
loads, so the same file serves a resume with another trainer size and the hand-off when the
planner moves ranks. `coordinator.json` is the step core's plain `RunState`
(`steps/commands.py`): step, policy version, role map, C-MLFQ prefix tree, ledger counts and
the trained task ids; the task order is a pure function of (seed, step), so the step is the
task position.

Invariants (tests/engine/runtime/test_checkpoint.py, tests/engine/runtime/test_e2e.py): `latest()` returns the newest
directory with COMPLETE and its files whole; a failed write leaves no temp dir behind; `save`
then `load` gives back the same RunState; a resumed run continues at the saved step with the saved role map and trains the same task ids; retention
never removes the newest complete checkpoint.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from steps.commands import RunState

MARKER = "COMPLETE"
log = logging.getLogger(__name__)


def save(run_dir: Path, state: RunState, save_trainer: Callable[[str, str], None], keep: int = 0) -> Path:
    """Write checkpoint step-N of `state`; `save_trainer(dir, what)` writes dir/trainer.pt (a collective).
    Then keep only the newest `keep` complete checkpoints (0: all)."""
    root = Path(run_dir) / "ckpt"
    name = f"step-{state.step:06d}"
    tmp = root / f".tmp-{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        save_trainer(str(tmp), f"the trainer to write checkpoint {name}")
        (tmp / "coordinator.json").write_text(json.dumps(state.to_dict()))
        sizes = {p.name: p.stat().st_size for p in tmp.iterdir()}
        (tmp / MARKER).write_text(json.dumps({"files": sizes}))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk stays no fuller than it was
        raise
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in (_complete(root)[:-keep] if keep else []) + [p for p in root.glob(".tmp-step-*") if p != tmp]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _complete(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("step-*") if (p / MARKER).is_file()) if root.is_dir() else []


def _torn(ckpt: Path) -> str:
    """Why a checkpoint with its marker is not whole ("" if it is): a file missing or cut short."""
    try:
        sizes = json.loads((ckpt / MARKER).read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return ""  # a marker from before sizes were recorded: nothing to check
    for name, size in sizes.items():
        have = (ckpt / name).stat().st_size if (ckpt / name).is_file() else None
        if have != size:
            return f"{name} is {'missing' if have is None else f'{have} of {size} bytes'}"
    return ""


def latest(run_dir: Path) -> Path | None:
    for ckpt in reversed(_complete(Path(run_dir) / "ckpt")):
        why = _torn(ckpt)
        if not why:
            return ckpt
        log.warning("[libra] checkpoint %s is torn (%s); skipping it", ckpt, why)
    return None


def load(ckpt: Path) -> RunState:
    return RunState.from_dict(json.loads((Path(ckpt) / "coordinator.json").read_text()))
