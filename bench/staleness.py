"""The price of staleness, measured: real GRPO with every trained batch a forced number of versions old.

    python -m bench.convergence --lags 0,1,2,4 [--objectives decoupled,bypass,recompute] [--model tiny|smollm2]
                                [--seeds 3] [--steps 30] [--target 0.8] [--out runs/staleness]

One process, the real pieces: the torch rollout engine (engine/rollout/engine.py) samples each step's
batch on the digit task (examples/digits_env.py: one turn, a dense reward) with the weights of
version max(0, v - lag), a snapshot kept since then, and the real trainer (engine/trainer/trainer.py)
trains version v on it under the chosen off-policy objective. So from step `lag` on every batch
is trained exactly `lag` versions late (the first `lag` steps 0..lag-1, as in any pipeline that
starts empty); nothing else differs between lags: same tasks, sampling seeds, model and lr.

What is measured: the reward of version u is the mean reward of the batch sampled with it (so a
lag does not also delay the measurement); steps to target = the first version whose batch reaches
`target`; seconds to target = the trainer's wall time to produce that version. From the mean steps
to target per lag it fits the simulator's per-trajectory model (sim/reward.py `fit_lag_efficiency`:
a trajectory trained `lag` versions late is worth gamma^lag of a fresh one) per objective.

Writes `staleness.json` (per lag x objective x seed: reward of every version, steps and seconds to
target) and `staleness.png` (reward vs version, mean over seeds). Last line: `lag_efficiency_gamma: G`
(the first objective's fit).
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path

from sim.reward import fit_lag_efficiency, predicted_steps

NUM_PROMPTS = 4  # tasks per step
NUM_SAMPLES = 8  # GRPO group size
MAX_NEW_TOKENS = 8


def run_forced_lag(*, lag: int, objective: str, seed: int, steps: int, model_name: str, lr: float) -> dict:
    """Train `steps` versions with every batch `lag` versions old; returns rewards per version and step times."""
    import copy

    import torch

    from engine.models import load_policy, render_prompt
    from engine.rollout.engine import Finished, RolloutConfig, RolloutEngine, RolloutRequest
    from engine.trainer.trainer import Trainer, TrainerConfig
    from examples.digits_env import DigitEnv

    torch.manual_seed(seed)
    model, tok = load_policy(model_name, seed=seed)
    rollout_model = copy.deepcopy(model).eval()
    trainer = Trainer(model, TrainerConfig(lr=lr, off_policy=objective, max_staleness=None))
    engine = RolloutEngine(rollout_model, tok, RolloutConfig(temperature=1.0, max_new_tokens_per_turn=MAX_NEW_TOKENS,
                                                             max_turns=1, max_total_tokens=256, max_batch=NUM_PROMPTS * NUM_SAMPLES,
                                                             seed=seed), device="cpu")
    env = DigitEnv()
    tasks = env.tasks()
    snapshots = {0: {k: v.detach().clone() for k, v in trainer.full_state_dict().items()}}
    reward_of: dict[int, float] = {}  # version -> mean reward of the batch it sampled
    trained_s: list[float] = []  # cumulative trainer wall seconds at the end of each step
    clock = 0.0
    try:
        for v in range(steps):
            behaviour = max(0, v - lag)
            engine.set_weights(snapshots[behaviour], behaviour)
            picked = [tasks[(v * NUM_PROMPTS + j) % len(tasks)] for j in range(NUM_PROMPTS)]
            for j, task in enumerate(picked):
                prompt = render_prompt(tok, task.messages, task.tools)
                for k in range(NUM_SAMPLES):
                    engine.add(RolloutRequest(f"{v}-{j}-{k}", task, env.start(task), prompt, f"{v}-{j}"))
            trajs = []
            while len(trajs) < NUM_PROMPTS * NUM_SAMPLES:
                trajs += [e.trajectory for e in engine.step() if isinstance(e, Finished)]
                if not engine.num_running:
                    engine.wait_for_tools(0.05)
            reward_of.setdefault(behaviour, statistics.mean(t.reward for t in trajs))
            start = time.perf_counter()
            metrics = trainer.train_step(trajs, v)
            clock += time.perf_counter() - start
            trained_s.append(clock)
            assert metrics["train/staleness_max"] == v - behaviour
            snapshots[v + 1] = {k: t.detach().clone() for k, t in trainer.full_state_dict().items()}
            snapshots.pop(v + 1 - lag - 1, None)  # only the last lag + 1 versions can still sample
    finally:
        engine.close()
    return {"reward_of_version": [reward_of[u] for u in sorted(reward_of)], "trained_s": trained_s}


def to_target(run: dict, target: float) -> tuple[int | None, float | None]:
    """(version, trainer seconds) of the first version whose batch reached `target` (version 0: the start)."""
    for u, r in enumerate(run["reward_of_version"]):
        if r >= target:
            return u, run["trained_s"][u - 1] if u else 0.0
    return None, None


def mean_range_cell(xs: list[float | None], fmt: str) -> str:
    """The "mean (min-max)" of the values that are not None, and "k/n" when some are None; "-" when all are."""
    got = [x for x in xs if x is not None]
    if not got:
        return "-"
    text = format(statistics.mean(got), fmt)
    if len(xs) > 1:
        text += f" ({format(min(got), fmt)}-{format(max(got), fmt)})" + ("" if len(got) == len(xs) else f" {len(got)}/{len(xs)}")
    return text


def plot(results: dict, target: float, path: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    objectives = sorted({o for o, _ in results})
    fig, axes = plt.subplots(1, len(objectives), figsize=(max(9, 5 * len(objectives)), 4), squeeze=False, sharey=True)
    for ax, objective in zip(axes[0], objectives):
        for (o, lag), runs in sorted(results.items(), key=lambda kv: kv[0][1]):
            if o != objective:
                continue
            n = min(len(r["reward_of_version"]) for r in runs)
            mean = [statistics.mean(r["reward_of_version"][u] for r in runs) for u in range(n)]
            ax.plot(range(n), mean, label=f"lag {lag}")
        ax.axhline(target, color="gray", ls="--", lw=1)
        ax.set_title(f"{objective}")
        ax.set_xlabel("policy version (updates)")
        ax.legend()
    axes[0][0].set_ylabel("mean reward of the version's batch")
    fig.suptitle(f"{model} policy on the digit task, every batch trained `lag` versions late (mean over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args) -> None:
    """`bench.convergence --lags ...`: the lag x objective x seed grid (module docstring)."""
    logging.basicConfig(level=logging.WARNING)
    lags = sorted({int(x) for x in args.lags.split(",") if x.strip()})
    objectives = [o for o in args.objectives.split(",") if o]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[tuple[str, int], list[dict]] = {}
    for objective in objectives:
        for lag in lags:
            if lag == 0 and objective != objectives[0] and (objectives[0], 0) in results:
                results[objective, 0] = results[objectives[0], 0]  # lag 0: no stale token, every objective is the same run
                continue
            for seed in range(args.seeds):
                t0 = time.perf_counter()
                run = run_forced_lag(lag=lag, objective=objective, seed=seed, steps=args.steps, model_name=args.model, lr=args.lr)
                results.setdefault((objective, lag), []).append(run)
                print(f"[staleness] {objective} lag {lag} seed {seed}: steps to target {to_target(run, args.target)[0]} "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"\n{args.model} on the digit task, lr {args.lr}, target {args.target}, {args.seeds} seeds, {args.steps} steps "
          f"(mean (min-max); k/n: seeds that reached it)")
    print(f"{'objective':<11} {'lag':>3} {'steps to target':>22} {'seconds to target':>24}")
    steps_of: dict[str, dict[int, float]] = {}
    table = []
    for (objective, lag), runs in sorted(results.items(), key=lambda kv: (objectives.index(kv[0][0]), kv[0][1])):
        hits = [to_target(r, args.target) for r in runs]
        steps, secs = [h[0] for h in hits], [h[1] for h in hits]
        # a seed that never reached it counts as the run's length: a lower bound on its steps
        censored = [s if s is not None else args.steps - lag for s in steps]
        steps_of.setdefault(objective, {})[lag] = statistics.mean(censored)
        table.append({"objective": objective, "lag": lag, "steps_to_target": steps, "seconds_to_target": secs})
        print(f"{objective:<11} {lag:>3} {mean_range_cell(steps, '.1f'):>22} {mean_range_cell(secs, '.1f'):>24}")
    fits = {}
    print("\nfitted per-trajectory model (sim/reward.py): a trajectory trained `lag` versions late is worth gamma^lag")
    for objective, by_lag in steps_of.items():
        if 0 not in by_lag or len(by_lag) < 2:
            continue
        gamma = fit_lag_efficiency(by_lag)
        fits[objective] = gamma
        pred = {lag: predicted_steps(by_lag[0], lag, gamma) for lag in by_lag}
        print(f"  {objective:<11} gamma {gamma:.3f}   measured/predicted steps: "
              + ", ".join(f"lag {lag} {by_lag[lag]:.1f}/{pred[lag]:.1f}" for lag in sorted(by_lag)))
    plot(results, args.target, out / "staleness.png", args.model)
    (out / "staleness.json").write_text(json.dumps({
        "model": args.model, "lr": args.lr, "target": args.target, "steps": args.steps, "seeds": args.seeds,
        "task": "examples/digits_env.py", "prompts_per_step": NUM_PROMPTS, "samples_per_prompt": NUM_SAMPLES,
        "table": table, "gamma": fits,
        "runs": {f"{o}/lag{lag}": runs for (o, lag), runs in results.items()}}, indent=1))
    print(f"wrote {out / 'staleness.png'} and {out / 'staleness.json'}")
    first = fits.get(objectives[0])
    print(f"lag_efficiency_gamma: {first if first is not None else float('nan'):.3f}")
