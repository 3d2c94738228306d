"""Adversarial drivers: each attack drives a real env through its tool API and says what happened.

Every attack is a function `(ctx) -> Outcome(safe, detail)`; an exception that escapes the env is
caught here and reported as `raised <Type>` (that is the "rank death" class: the engine would see
it). The drivers import no torch, so they also run in a bare venv as an unprivileged user:

    python tests/envs/sandbox/adversarial_drivers.py [--isolation auto|rlimits] [--root-dir DIR]
                                        [--socket-dir DIR] [--only a,b] [--json OUT]

tests/envs/sandbox/test_adversarial.py runs them as root in-process, and in subprocesses as uid 65534 and in
the rlimits mode, and asserts that every applicable attack is `safe`.
The attacks live in tests/envs/sandbox/adversarial_reward.py, adversarial_escapes.py and adversarial_limits.py
(registered in that order), what they share in tests/envs/sandbox/adversarial_base.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# importing an attack module registers its attacks; this is the order they run and print in
import adversarial_reward  # noqa: E402, F401, I001
import adversarial_escapes  # noqa: E402, F401
import adversarial_limits  # noqa: E402, F401
from adversarial_base import ATTACKS, Ctx, Outcome  # noqa: E402
from envs.sandbox.sandbox import Sandbox  # noqa: E402

__all__ = ["ATTACKS", "Ctx", "Outcome", "run_all", "main"]

# ---- driver ----------------------------------------------------------------------------------------


def run_all(ctx: Ctx, only: list[str] | None = None) -> dict[str, dict]:
    results = {}
    for name, (cls, fn) in ATTACKS.items():
        if only and name not in only:
            continue
        t0 = time.monotonic()
        try:
            o = fn(ctx)
        except Exception as e:  # noqa: BLE001 - an exception escaping the env is the finding
            o = Outcome(False, f"raised {type(e).__name__}: {str(e)[:120]}")
        results[name] = {"class": cls, **asdict(o), "seconds": round(time.monotonic() - t0, 2)}
    for env in (ctx._swe, ctx._math):
        if env is not None:
            env.close()
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--isolation", default="auto")
    ap.add_argument("--root-dir", default="")
    ap.add_argument("--custom-root", default="", help="a root dir outside /tmp for other_episode_under_custom_root")
    ap.add_argument("--socket-dir", default="")
    ap.add_argument("--only", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    ctx = Ctx(isolation=args.isolation, root_dir=args.root_dir, socket_dir=args.socket_dir)
    ctx.notes["custom_root"] = args.custom_root
    results = run_all(ctx, [s for s in args.only.split(",") if s] or None)
    for name, r in results.items():
        print(f"{r['class']:<7} {name:<34} {'SAFE ' if r['safe'] else 'UNSAFE'} {r['detail']}", flush=True)
    if args.json:
        isolation = Sandbox(ctx.sandbox_cfg()).isolation
        Path(args.json).write_text(json.dumps({"isolation": isolation, "attacks": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
