"""Convergence for real: train to a reward target with each system, several seeds, same tasks.

    python -m bench.convergence [--systems libra,colocate,static,verl-async,fully-async,partial-rollout,libra-hybrid]
                                [--seeds 3] [--steps 40] [--target 0.8] [--out runs/convergence]
                                [--profile FILE | --no-profile] [--model tiny|smollm2] [--lr LR]
    python -m bench.convergence --lags 0,1,2,4 [--objectives decoupled,bypass,recompute] [--model ...] [--seeds N]

Each (system, seed) is a real `python libra.py` run (separate processes, one after another, so
they do not share the cores) of the tiny policy (or `--model smollm2`) on `examples/digits_env.py` (a dense reward a
random policy can climb) with the same tasks, seed and GRPO settings. Libra's planner prices
layouts with this machine's measured costs (`bench.profile`, measured once into the output dir
unless `--profile` names one; `--no-profile` plans on the built-in CPU table, which on 2 cores
moves ranks to a trainer that FSDP across shared cores makes slower). It reports per system:
steps and wall seconds to the first step whose mean reward reaches the target (mean and range
over seeds; "-" when a seed never reached it), tokens/s, and the reward-vs-wall-time curves
(`convergence.png`). The price of staleness itself is measured with forced lags (below); a
comparison of whole systems mixes it with their step times.

With `--lags` it measures the price of staleness instead (bench/staleness.py): the same task and
trainer with every batch trained a forced number of versions late, per off-policy objective, and
fits the simulator's per-trajectory lag model; its last line is then `lag_efficiency_gamma: G`.

Last line: `time_to_target colocate/libra: R` (mean over seeds; > 1: libra reaches the target sooner).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from bench import staleness
from bench.staleness import mean_range_cell

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("libra", "colocate", "static", "verl-async", "fully-async", "partial-rollout", "libra-hybrid")
NPROC = 4
RUN_ARGS = ("--env", "examples.digits_env:DigitEnv", "--device", "cpu", "--nproc", str(NPROC),
            "--step.prompts-per-step", "4", "--step.samples-per-prompt", "8", "--rollout.max-new-tokens-per-turn", "8",
            "--rollout.max-turns", "1")
# the tiny policy learns the digit task in ~10-15 steps at 2e-2; 1e-3 (the tiny preset) needs ~10x more
DEFAULT_LR = {"tiny": 2e-2, "smollm2": 1e-5}


def run_one(system: str, seed: int, steps: int, out: Path, profile: str = "", model: str = "tiny", lr: float = 2e-2) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "libra.py"), *RUN_ARGS, "--model", model, "--trainer.lr", str(lr),
           "--system", system, "--seed", str(seed),
           "--steps", str(steps), "--run.loggers", "", "--out", str(out)]
    if profile:
        cmd += ["--planner.profile", profile]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{system} seed {seed} failed (exit {proc.returncode}): {proc.stderr[-800:]}")
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    # a benchmark reads the rows only; the run's last checkpoints (SmolLM2: 1.7 GB each) over every system and
    # seed filled a 78 GB disk
    shutil.rmtree(out / "ckpt", ignore_errors=True)
    return {"summary": summary, "rows": rows}


def to_target(rows: list[dict], target: float) -> tuple[int | None, float | None]:
    """(step, wall seconds) of the first step whose mean reward reaches `target`."""
    for r in rows:
        if r["reward_mean"] >= target:
            return r["step"], r["time_s"]
    return None, None


def plot(results: dict, target: float, path: Path, model: str = "tiny") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (system, runs) in enumerate(results.items()):
        for j, run in enumerate(runs):
            ax.plot([r["time_s"] for r in run["rows"]], [r["reward_mean"] for r in run["rows"]], color=colors[i % len(colors)],
                    alpha=0.8, label=system if j == 0 else None)
    ax.axhline(target, color="gray", ls="--", lw=1)
    ax.set_xlabel("wall seconds (this machine)")
    ax.set_ylabel("mean reward of the step's batch")
    ax.set_title(f"{model} policy on the digit task: reward vs wall time, every seed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--target", type=float, default=0.8)
    p.add_argument("--out", default="runs/convergence")
    p.add_argument("--model", default="tiny", help="tiny | smollm2 (about 45 s a step here: use few steps and seeds)")
    p.add_argument("--lr", type=float, default=None, help="trainer learning rate (default: 2e-2 tiny, 1e-5 smollm2)")
    p.add_argument("--profile", default="", help="a bench.profile JSON for the planner (default: measure one, ~12 s)")
    p.add_argument("--no-profile", action="store_true", help="plan on the built-in CPU table instead of measured costs")
    p.add_argument("--lags", default="", help="forced trained lags, e.g. 0,1,2,4: measure the price of staleness instead")
    p.add_argument("--objectives", default="decoupled,bypass,recompute", help="with --lags: the off-policy objectives")
    args = p.parse_args()
    if args.lags:
        args.lr = args.lr if args.lr is not None else DEFAULT_LR.get(args.model, 1e-5)
        args.out = args.out if args.out != "runs/convergence" else "runs/staleness"
        staleness.main(args)
        return
    systems = [s for s in args.systems.split(",") if s]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    profile = args.profile
    lr = args.lr if args.lr is not None else DEFAULT_LR.get(args.model, 1e-5)
    if not profile and not args.no_profile:
        profile = str(out / f"{args.model}-cpu-profile.json")
        print(f"[convergence] measuring this machine's costs for the planner -> {profile} ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "bench.profile", "--model", args.model, "--out", profile], cwd=ROOT, check=True,
                       capture_output=True, timeout=1800)
    results: dict[str, list[dict]] = {s: [] for s in systems}
    for seed in range(args.seeds):
        for system in systems:
            print(f"[convergence] {system} seed {seed} ...", file=sys.stderr, flush=True)
            results[system].append(run_one(system, seed, args.steps, out / f"{system}-seed{seed}", profile,
                                           args.model, lr))
    print(f"{'system':<16} {'steps to target':>22} {'seconds to target':>24} {'tokens/s':>14} {'staleness max':>13} "
          f"{'elastic steps':>13} {'hybrid steps':>12}")
    steps_of: dict[str, list[int | None]] = {}
    secs_of: dict[str, list[float | None]] = {}
    for system, runs in results.items():
        hits = [to_target(r["rows"], args.target) for r in runs]
        steps_of[system], secs_of[system] = [h[0] for h in hits], [h[1] for h in hits]
        tps = [r["summary"]["tokens_per_s"] for r in runs]
        stale = max(max(row["staleness_max"] for row in r["rows"]) for r in runs)
        # the layouts libra's design exercised, from the rows: steps an idle instance helped train (elastic joins),
        # steps trained on time-shared ranks that also generated the next step (hybrid: colocated with a lag)
        elastic = [sum(1 for row in r["rows"] if row.get("train/elastic_helpers")) for r in runs]
        hybrid = [sum(1 for row in r["rows"] if row["role_map"]["trainer"] + row["role_map"]["rollout"] > NPROC
                      and row["staleness_max"] > 0) for r in runs]
        print(f"{system:<16} {mean_range_cell(steps_of[system], '.1f'):>22} {mean_range_cell(secs_of[system], '.1f'):>24} "
              f"{mean_range_cell(tps, '.0f'):>14} {stale:>13} {mean_range_cell(elastic, '.1f'):>13} "
              f"{mean_range_cell(hybrid, '.1f'):>12}")
    plot(results, args.target, out / "convergence.png", args.model)
    (out / "convergence.json").write_text(json.dumps(
        {"target": args.target, "steps": args.steps, "seeds": args.seeds, "run_args": [*RUN_ARGS, "--model", args.model, "--trainer.lr", str(lr)],
         "steps_to_target": steps_of, "seconds_to_target": secs_of}, indent=2))

    def mean(xs):
        got = [x for x in xs if x is not None]
        return statistics.mean(got) if len(got) == len(xs) and got else None

    print(f"wrote {out / 'convergence.png'} and {out / 'convergence.json'}")
    lib, col = mean(secs_of.get("libra", [])), mean(secs_of.get("colocate", []))
    print(f"time_to_target colocate/libra: {col / lib if lib and col else float('nan'):.2f}")


if __name__ == "__main__":
    main()
