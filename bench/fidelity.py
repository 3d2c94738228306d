"""Simulator fidelity against real runs: `python -m bench.fidelity [--profile FILE] [--steps 4]`.

1. Profile: the measured HardwareProfile of this machine (`--profile`, or `python -m bench.profile`
   runs first and writes one).
2. Real: `libra`, `static` and `colocate` on the same tasks and seed (tiny model by default), one
   after the other through the runtime's `--compare`, the planner reading the same profile.
3. Simulated: each real run replayed (`sim.run.replay`): the run's own trajectories (lengths,
   turns, tool latencies), its first layout, buckets, router and planner settings from its
   config.json, and the measured profile as the cost model.
4. Per system: measured and predicted mean step time, mean absolute step-time error, and the
   share of the error in rollout, training and sync time; then whether the systems' order by
   total time matches.

The step-time error of a system is its mean absolute error over the mean measured step time,
sum|predicted - measured| / sum(measured): with an async pipeline every other step ends moments
after the previous one (both batches were admitted together), and a per-step relative error of
such 0.02 s steps says nothing; the per-step MAPE is printed beside it.

Last line `sim_step_error: E`, the largest per-system step-time error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SYSTEMS = ("libra", "static", "colocate")


def real_setup(run_dir: Path):
    """The run's own first layout and scheduler settings, as the runtime derived them."""
    from config import load_config
    from engine.runtime.run import valid_tp_degrees
    from scheduler.systems import initial_role_map
    from sim.run import RealSetup

    cfg = load_config(run_dir / "config.json")
    role_map = initial_role_map(cfg.run.system, cfg.run.nproc or 4, buckets=cfg.buckets,
                                trainer_frac=cfg.launch.trainer_frac, allowed_tp=valid_tp_degrees(cfg))
    planner = dataclasses.replace(cfg.planner, allowed_tp=valid_tp_degrees(cfg))
    return cfg, RealSetup(role_map=role_map, buckets=cfg.buckets, router=cfg.router, planner=planner)


def replay_one(run_dir: Path, profile: str) -> dict:
    from sim.run import replay

    cfg, real = real_setup(run_dir)
    return replay(run_dir, system=cfg.run.system, num_devices=real.role_map.world_size, profile=profile, real=real,
                  max_staleness=cfg.step.max_staleness, max_seqs_per_instance=cfg.rollout.max_batch,
                  prompts_per_step=cfg.step.prompts_per_step, samples_per_prompt=cfg.step.samples_per_prompt)


def step_error(r: dict) -> float:
    measured, predicted = r["measured_step_s"], r["predicted_step_s"]
    return sum(abs(p - m) for m, p in zip(measured, predicted)) / max(sum(measured), 1e-9)


def _mean(rows: list[dict], key: str) -> float:
    return statistics.fmean(r[key] for r in rows) if rows else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--bench", default="swe")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", default="", help="a HardwareProfile JSON; empty = run bench.profile first")
    p.add_argument("--out", default="", help="where the real runs go (default runs/fidelity-<time>)")
    p.add_argument("--reuse", action="store_true", help="replay the real runs already in --out instead of running them")
    p.add_argument("--extra", default="", help="more libra.py flags for the real runs, space-separated")
    args = p.parse_args()
    out = Path(args.out or f"runs/fidelity-{args.bench}-{args.model}-{time.strftime('%Y%m%d-%H%M%S')}")
    profile = args.profile or str(out / f"profile-{args.model}-cpu.json")
    if not args.profile and not Path(profile).is_file():
        subprocess.run([sys.executable, "-m", "bench.profile", "--model", args.model, "--out", profile], check=True)
    if not args.reuse:
        cmd = [sys.executable, "libra.py", "--bench", args.bench, "--model", args.model, "--device", "cpu", "--steps",
               str(args.steps), "--seed", str(args.seed), "--compare", "--compare-systems", ",".join(SYSTEMS),
               "--planner.profile", profile, "--out", str(out),
               "--planner.first-design", "split",  # the replay starts libra on the launcher's split (`real_setup`)
               *args.extra.split()]
        print("real:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    results = {name: replay_one(out / name, profile) for name in SYSTEMS}
    head = (f"{'system':<10} {'steps':>5} {'real step s':>11} {'sim step s':>10} {'step err':>8} {'MAPE':>6} "
            f"{'rollout r/s':>13} {'train r/s':>13} {'sync r/s':>13} {'reconfig r/s':>13}")
    print(f"bench={args.bench} model={args.model} steps={args.steps} seed={args.seed} profile={profile}")
    print(head)
    print("-" * len(head))
    for name, r in results.items():
        m, s = r["measured"], r["predicted"]
        cols = " ".join(f"{_mean(m, k):>6.2f}/{_mean(s, k):<6.2f}" for k in ("rollout_s", "train_s", "sync_s", "reconfig_s"))
        print(f"{name:<10} {r['steps']:>5} {statistics.fmean(r['measured_step_s']):>11.2f} "
              f"{statistics.fmean(r['predicted_step_s']):>10.2f} {step_error(r):>8.3f} {r['mape']:>6.2f} {cols}")
    real_order = sorted(results, key=lambda n: results[n]["measured_total_s"])
    sim_order = sorted(results, key=lambda n: results[n]["predicted_total_s"])
    print(f"order by total time: real {' < '.join(real_order)} | sim {' < '.join(sim_order)} | "
          f"{'match' if real_order == sim_order else 'DIFFER'}")
    (out / "fidelity.json").write_text(json.dumps({n: {k: v for k, v in r.items() if k not in ("measured", "predicted")}
                                                   for n, r in results.items()}, indent=1))
    print(f"sim_step_error: {max(step_error(r) for r in results.values()):.3f}")


if __name__ == "__main__":
    main()
