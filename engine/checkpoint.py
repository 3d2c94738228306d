"""Checkpoints of a run: trainer state + coordinator state, complete or absent.

Layout: `RUN/ckpt/step-000003/{trainer.pt, coordinator.json, COMPLETE}`. A checkpoint is
written into `RUN/ckpt/.tmp-step-000003/`, the completion marker last, then renamed into
place, so a run killed mid-write leaves only a temp dir that `latest()` ignores.

The trainer state (model + optimizer, full unsharded tensors) is what a new trainer group
loads, so the same file serves a resume with another trainer size and the hand-off when the
planner moves ranks. The coordinator state holds the step, the policy version, the role map, the
C-MLFQ prefix tree and the ledger counts; the task order is a pure function of (seed, step), so
the step is the task position.

Invariants (tests/test_e2e.py): `latest()` returns the newest directory with COMPLETE; a resumed
run continues at the saved step with the saved role map and trains the same task ids.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from scheduler.layout import RoleMap

MARKER = "COMPLETE"


def save_run_state(coord) -> Path:
    root = coord.out / "ckpt"
    name = f"step-{coord.trained:06d}"
    tmp = root / f".tmp-{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for r in coord.role_map.trainer_ranks:
        coord.mailbox.send(r + 1, ("save", str(tmp)))
    coord.wait_for("saved", 1, f"the trainer to write checkpoint {name}")
    tree = getattr(coord.router, "tree", None)
    state = {
        "step": coord.trained,
        "policy_version": coord.version,
        "role_map": coord.role_map.to_dict(),
        "prefix_tree": tree.to_json() if tree is not None else None,
        "ledger": coord.ledger.counts(),
        "trained_task_ids": coord.ledger.trained_order,
    }
    (tmp / "coordinator.json").write_text(json.dumps(state))
    (tmp / MARKER).write_text("ok\n")
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def latest(run_dir: Path) -> Path | None:
    root = Path(run_dir) / "ckpt"
    done = sorted(p for p in root.glob("step-*") if (p / MARKER).is_file()) if root.is_dir() else []
    return done[-1] if done else None


def load_state(ckpt: Path) -> dict:
    state = json.loads((ckpt / "coordinator.json").read_text())
    state["role_map"] = RoleMap.from_dict(state["role_map"])
    state["dir"] = str(ckpt)
    return state
