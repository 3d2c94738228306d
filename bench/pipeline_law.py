"""Pipelined splits against the simulator, part by part: `python -m bench.pipeline_law [--seed 0] [--quick]`.

A split admits a step whenever the trainer finishes one, at most L steps ahead, so L + 1 steps' trajectories
hold the rollout at all times, each from its admission until its batch is trained. By Little's law the period
is that residence over L + 1:
  step batches (a step's batch is ready when its slowest trajectory is):  P = max(T + S, (R + T + S) / (L + 1))
  finish-order batches (the first complete groups; a group also waits for the next batch, half a period on
  average):                                                              P = max(T + S, (G + T + S) / (L + 1/2))
R: the mean over batches of admission to the slowest finish; G: the same over GRPO groups.

For each layout of `CASES` (a tuned peer's kind of layout, held fixed: `static` for step batches,
`partial-rollout` for finish order), this simulates the run and prints:
- the simulated period P (steps from a quarter of the run on), R or G, and T + S as simulated;
- `law`: the law on the simulated R or G (does the pipeline's shape hold?);
- `planner`: the price libra's design ranking puts on the layout, on the run's lengths (`design_price_s`: a
  batch's makespan alone on the instances, over L + 1, at least their throughput);
- `occupancy`: a candidate model (`occupancy_period_s`) that prices R or G from the lengths alone, each
  trajectory at the per-token time of the batch the pipeline keeps in flight;
- the planner's length sample against the lengths that finished: `Workload.from_stats` counts a trajectory
  still running at every step's end it spans.
Last line `pipeline_law_error: E`, the largest |law / P - 1|.

The candidate model is not the planner's (docs/benchmarks.md, "The pipelined split's period"): priced at the
simulated period, its per-token time in the batch is 0.5-0.7 of the simulator's, the burstiness of admission it
leaves out (joins come when batches are full, so a sequence sees 1.5x the instances' share of stalls; the batch
while busy is above the all-time mean); it takes a group's slowest as n independent draws (a prompt's samples are
alike, so the simulated groups' slowest is shorter) and leaves out what a high-TP bucket does for the tail.

Invariants (tests/bench/test_pipeline_law.py): the order-statistic weights are exact; the candidate's period is
never below training and sync, shrinks as the lag grows and as instances are added, is longer for step batches
than for finish order and for a heavier tail; on the simulator the law holds within 10% on the quick case, and a
finish-order run's planner sample is longer than its finished lengths.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from dataclasses import dataclass

from scheduler.design import finish_order_sample
from scheduler.layout import RoleMap, split_role_map
from scheduler.layout_model import LayoutModel, Scales, Workload

ITERATIONS = 40  # bisection steps on the period, and at most as many fixed-point steps on a batch


@dataclass(frozen=True)
class Case:
    preset: str
    bench: str
    num_trainer: int
    tp: int
    lag: int
    by_finish: bool  # finish-order batches (partial-rollout) or step batches (static)


CASES = (
    Case("paper_910b3_160", "search", 80, 8, 1, False), Case("paper_910b3_160", "search", 80, 8, 2, False),
    Case("paper_910b3_160", "search", 80, 8, 4, False), Case("paper_910b3_160", "swe", 80, 8, 2, False),
    Case("paper_a800_48", "swe", 24, 8, 1, False), Case("paper_a800_48", "math", 24, 8, 2, False),
    Case("paper_910b3_160", "search", 80, 8, 1, True), Case("paper_910b3_160", "search", 80, 8, 2, True),
    Case("paper_910b3_160", "search", 112, 8, 2, True), Case("paper_910b3_160", "swe", 80, 8, 2, True),
    Case("paper_910b3_160", "math", 80, 8, 2, True), Case("paper_a800_48", "swe", 24, 8, 2, True),
    Case("paper_a800_48", "math", 24, 8, 2, True),
)
QUICK = (Case("default", "search", 8, 4, 1, False), Case("default", "search", 8, 4, 2, True))


def slowest_of_weights(num_samples: int, n: int) -> list[float]:
    """w_i with sum_i w_i x_(i) = E[the largest of n independent draws] from a sorted sample of `num_samples`."""
    return [((i + 1) / num_samples) ** n - (i / num_samples) ** n for i in range(num_samples)]


def occupancy_period_s(model: LayoutModel, rm: RoleMap, wl: Workload, *, lag: int, by_finish: bool, group_size: int,
                       train_s: float, sync_s: float) -> float:
    """The law's period with R or G priced from `wl` alone (the candidate model: module docstring).

    1. The instances are pooled, each TP's taking the tokens by its devices; decode steps run at the
       token-weighted context E[x^2] / 2E[x] (a long trajectory decodes for more of the steps).
    2. At period P an instance's batch is (N / P) x E[tokens] x (seconds in the batch per token) / instances
       (Little's law): a token's time is its decode share at step(batch, context) and its prefill share (tool
       outputs), both stretched by the stall share (every join's prefill stops the whole batch). Iterated to a
       fixed point, at most the engine's cap.
    3. R or G: order statistics of the sample (the slowest of the step's N, or of a group's n) at that per-token
       time, plus the tools' time; P is the law's root (the slowest shrinks as P grows), by bisection."""
    lens = sorted(wl.trajectory_tokens)
    weights = slowest_of_weights(len(lens), group_size if by_finish else max(1, round(wl.num_trajectories)))
    residence = lag + (0.5 if by_finish else 1.0)
    f, n, mean = wl.decode_frac, wl.num_trajectories, sum(lens) / len(lens)
    ctx = sum(x * x for x in lens) / (2 * sum(lens))
    cm, ppt = model.cm, model._prefill_per_token_s
    by_tp: dict[int, int] = {}
    for inst in rm.instances:
        by_tp[inst.tp] = by_tp.get(inst.tp, 0) + 1
    devices = sum(tp * k for tp, k in by_tp.items())

    def per_token_s(period: float) -> float:
        total = 0.0
        for tp, k in by_tp.items():
            tokens = mean * tp * k / devices  # this TP's share of a trajectory's tokens
            stall = min(0.95, n / period * tokens * (1 - f) * ppt(tp) / k)
            batch, u = 1.0, 0.0
            for _ in range(ITERATIONS):
                u = (f * cm.decode_step_s(batch, ctx, tp) + (1 - f) * ppt(tp)) / (1 - stall)
                nxt = min(float(model.max_batch), max(1.0, n / period * tokens * u / k))
                if abs(nxt - batch) < 1e-3:
                    break
                batch = nxt
            total += u * tokens / mean
        return total

    slowest_tokens = sum(w * x for w, x in zip(weights, lens))
    base = train_s + sync_s

    def law(period: float) -> float:
        return max(base, (slowest_tokens * (per_token_s(period) + wl.tool_s_per_token) + base) / residence)

    lo = max(base, 1e-6)
    if law(lo) <= lo:
        return lo
    hi = law(lo)  # the law falls as the period grows: its value at lo bounds the root
    for _ in range(ITERATIONS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if law(mid) > mid else (lo, mid)
    return hi


def design_price_s(model: LayoutModel, rm: RoleMap, wl: Workload, *, lag: int, by_finish: bool, group_size: int) -> float:
    """The step time libra's design ranking puts on `rm` (scheduler/design.py): the pipelined step on the batch it
    waits for (finish order: the sample capped at the quantile the batch waits for), at least the instances'
    throughput for the steps decoding together."""
    if not by_finish:
        return max(model.predict(rm, wl, Scales())[0], model.throughput_s(rm, wl))
    wide = dataclasses.replace(wl, num_trajectories=wl.num_trajectories * (lag + 1))
    return max(model.predict(rm, finish_order_sample(wl, lag, group_size), Scales())[0],
               model.throughput_s(rm, wide) / (lag + 1))


def filled_period_s(rows: list[dict]) -> tuple[int, float]:
    """(k0, the mean period from row k0 on): steps from a quarter of the run on (the pipeline has filled), the last
    left out (it drains)."""
    k0, last = len(rows) // 4, rows[-2]
    return k0, (last["time_s"] - rows[k0]["time_s"]) / (last["step"] - rows[k0]["step"])


def measure(case: Case, seed: int = 0) -> dict:
    """Simulate `case`'s layout held fixed and price it (module docstring)."""
    from bench.presets import get_preset
    from sim.run import buckets_of, cost_model_of, play_system

    cfg = get_preset(case.preset, case.bench, seed).replace(max_staleness=case.lag)
    g, single = cfg.num_devices, buckets_of(cfg).single()
    n = (g - case.num_trainer) // case.tp
    if n < 1:
        raise ValueError(f"{case}: {g} devices leave no TP{case.tp} instance beside {case.num_trainer} trainers")
    rm = split_role_map(world_size=g, num_trainer=g - n * case.tp, rollout_tp=((single[0].name, case.tp),) * n,
                        buckets=single)
    stats: list = []
    _, rows, admitted, _ = play_system(cfg, "partial-rollout" if case.by_finish else "static", layout=rm, record=True,
                                       stats_out=stats)
    k0, period = filled_period_s(rows)
    t0 = rows[k0]["time_s"]
    by: dict = {}
    for req in admitted:
        by.setdefault(req.group_id if case.by_finish else req.batch, []).append(req)
    spans = [max(r.finished_at for r in v) - min(r.admitted_at for r in v) for v in by.values()
             if min(r.admitted_at for r in v) > t0 and all(r.finished_at is not None for r in v)]
    slowest = statistics.mean(spans)
    train_sync = statistics.mean(r["train_s"] + r["sync_s"] for r in rows[k0:-1])
    law = max(train_sync, (slowest + train_sync) / (case.lag + (0.5 if case.by_finish else 1.0)))
    sample = Workload.from_stats(stats)
    unbiased = Workload.from_stats([dataclasses.replace(s, censored_tokens=()) for s in stats])  # the finished only
    model = LayoutModel(cost_model_of(cfg), single, max_batch=cfg.max_seqs_per_instance, lookahead=case.lag)
    planner = design_price_s(model, rm, unbiased, lag=case.lag, by_finish=case.by_finish, group_size=cfg.samples_per_prompt)
    occupancy = occupancy_period_s(model, rm, unbiased, lag=case.lag, by_finish=case.by_finish,
                                   group_size=cfg.samples_per_prompt, train_s=model.train_s(unbiased, len(rm.trainer_ranks), Scales()),
                                   sync_s=model.cm.sync_s(len(rm.rollout_ranks), len(rm.trainer_ranks)))
    return {"case": case, "layout": rm.describe(version=False), "period_s": period, "slowest_s": slowest,
            "train_sync_s": train_sync, "law_s": law, "planner_s": planner, "occupancy_s": occupancy,
            "sample_mean": statistics.mean(sample.trajectory_tokens), "finished_mean": statistics.mean(unbiased.trajectory_tokens)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="two 16-device cases (seconds), not the paper presets")
    args = p.parse_args()
    print(f"{'case':<58} {'P s':>7} {'R|G s':>7} {'T+S s':>7} {'law':>6} {'planner':>8} {'occupancy':>10} {'sample/finished':>16}")
    worst = 0.0
    for case in QUICK if args.quick else CASES:
        m = measure(case, args.seed)
        name = f"{case.preset} {case.bench} {'finish' if case.by_finish else 'step'} L={case.lag} {m['layout']}"
        per = m["period_s"]
        worst = max(worst, abs(m["law_s"] / per - 1))
        print(f"{name:<58} {per:>7.1f} {m['slowest_s']:>7.1f} {m['train_sync_s']:>7.1f} {m['law_s'] / per:>6.2f} "
              f"{m['planner_s'] / per:>8.2f} {m['occupancy_s'] / per:>10.2f} {m['sample_mean'] / m['finished_mean']:>16.2f}",
              flush=True)
    print("law, planner, occupancy: each price over the simulated period P; sample/finished: the planner's mean length "
          "over the finished trajectories' mean")
    print(f"pipeline_law_error: {worst:.3f}")


if __name__ == "__main__":
    main()
