"""Export a run's trained policy as a Hugging Face directory (config.json + safetensors + tokenizer).

    python libra.py export RUN_DIR [--step N] --to DIR [--dtype float32|bfloat16]
    python -m engine.runtime.export RUN_DIR [--step N] --to DIR

Algorithm:
  1. Read RUN_DIR/config.json for the policy spec (`run.model`: tiny, smollm2 or a local dir) and
     seed; pick the checkpoint: RUN_DIR/ckpt/step-N, or the newest complete one.
  2. Build the same architecture with `load_policy` (the weights it starts with are replaced)
     and load the trainer's full state dict from the checkpoint's trainer.pt (strict: every
     name must match).
  3. `save_pretrained` (safetensors) and the tokenizer into a temp dir beside DIR, then rename it
     into place, so DIR is either complete or absent. A tokenizer rendered with Libra's Hermes
     text template gets that template as its `chat_template` (engine/chat.py), so
     `apply_chat_template` elsewhere builds the prompts the policy was trained on.
     `libra_export.json` records where the weights came from (run, step, policy version).

Invariants (tests/engine/runtime/test_export.py): the exported tensors equal the trainer's full state dict;
greedy generation from `AutoModelForCausalLM.from_pretrained(DIR)` matches the rollout engine
holding the trainer's weights on one prompt; the exported tokenizer encodes like the run's and
its chat template renders `render_text`; a missing step or a non-empty DIR is a one-line
ValueError and leaves nothing behind.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from engine.runtime import checkpoint

log = logging.getLogger("libra")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def find_checkpoint(run_dir: Path, step: int | None = None) -> Path:
    """RUN_DIR/ckpt/step-N (complete), or the newest complete checkpoint when `step` is None."""
    done = sorted(p for p in (run_dir / "ckpt").glob("step-*") if (p / checkpoint.MARKER).is_file())
    steps = [int(p.name.split("-")[1]) for p in done]
    if step is None:
        if not done:
            raise ValueError(f"{run_dir}: no complete checkpoint under {run_dir / 'ckpt'}; "
                             "a run writes one at its end (and every --step.checkpoint-every steps)")
        return done[-1]
    if step not in steps:
        raise ValueError(f"--step {step}: {run_dir} has no complete checkpoint of step {step}; "
                         f"its checkpoints are steps {steps or 'none'} (leave out --step for the newest)")
    return done[steps.index(step)]


def _run_config(run_dir: Path) -> dict:
    path = run_dir / "config.json"
    if not path.is_file():
        raise ValueError(f"{run_dir} is not a Libra run directory (no config.json); pass the --out of a finished run")
    return json.loads(path.read_text())["run"]


def _check_target(to: Path) -> None:
    if to.exists() and (not to.is_dir() or any(to.iterdir())):
        raise ValueError(f"--to {str(to)!r} exists and is not an empty directory; pass a new path (export never overwrites)")
    from engine.runtime.preflight import check_out_dir

    check_out_dir(to, "--to")


def export_policy(run_dir: Path, to: Path, *, step: int | None = None, dtype: str = "float32") -> Path:
    """Write the policy of `run_dir`'s checkpoint (newest, or `step`) to `to` as an HF directory."""
    from engine.chat import HERMES_CHAT_TEMPLATE, template_knows_tools
    from engine.models import load_policy

    run_dir, to = Path(run_dir), Path(to)
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r} is not one of {sorted(DTYPES)}")
    run = _run_config(run_dir)
    ckpt = find_checkpoint(run_dir, step)
    _check_target(to)
    state = torch.load(ckpt / "trainer.pt", map_location="cpu", weights_only=True)
    model, tokenizer = load_policy(run["model"], device="cpu", seed=int(run.get("seed", 0)))
    model.load_state_dict(state["model"], strict=True)
    model.to(DTYPES[dtype])
    if not template_knows_tools(tokenizer):
        tokenizer.chat_template = HERMES_CHAT_TEMPLATE
    to.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{to.name}-", dir=to.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        info = {"run_dir": str(run_dir.resolve()), "checkpoint": ckpt.name, "step": int(ckpt.name.split("-")[1]),
                "policy_version": int(state["policy_version"]), "model": run["model"], "bench": run.get("bench"),
                "system": run.get("system"), "dtype": dtype}
        (tmp / "libra_export.json").write_text(json.dumps(info, indent=2))
        _as_if_made_here(tmp)
        if to.exists():
            to.rmdir()  # empty, checked above
        tmp.rename(to)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("[libra] exported %s (policy v%d) to %s", ckpt, info["policy_version"], to)
    return to


def _as_if_made_here(folder: Path) -> None:
    """The modes a plain mkdir and write would give under this umask: the staging dir came from mkdtemp
    (0700), so an exported model was readable by its owner only."""
    mask = os.umask(0)
    os.umask(mask)
    folder.chmod(0o777 & ~mask)
    for f in folder.rglob("*"):
        f.chmod((0o777 if f.is_dir() else 0o666) & ~mask)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="libra.py export", description="Export a run's trained policy as a Hugging Face directory.")
    p.add_argument("run_dir", help="the run directory (--out of a run)")
    p.add_argument("--to", required=True, help="new directory to write (config.json, model.safetensors, tokenizer)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step to export (default: the newest)")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="dtype of the saved weights (default float32)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        out = export_policy(Path(args.run_dir), Path(args.to), step=args.step, dtype=args.dtype)
    except ValueError as exc:
        log.error("libra export: %s", exc)
        return 2
    print(f"exported to {out}: load it with AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level="INFO", format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    sys.exit(main())
