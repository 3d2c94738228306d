"""Every design libra may choose, priced by its ranking and simulated held fixed: `python -m bench.design_prices
[--seed 0] [--quick | --scenarios]` (the paper presets; `--scenarios`: bench.presets.SCENARIOS, ~20 s).

Libra's ranking (scheduler/design.py) chooses among split (step batches, finish order), colocated and time-shared
designs by a price per family. A price that is right for one family and optimistic for another moves the choice to
the optimistic one, whatever the run's lengths; so fixing one family's price alone can make libra slower
(docs/benchmarks.md, "One family's price at a time"). This bench says how far each family's price is from the
simulator, on the same lengths:

1. The run's lengths: a `static` run's finished trajectories (step batches: a complete sample, nothing censored).
2. `rank_designs` on those lengths, at the lag range libra gets in a comparison (`max_lag` 4): the best candidate of
   each family and lag (libra lag 1/2/4, libra-partial lag 1/2, colocate, libra-hybrid).
3. Each simulated held fixed (`play_system(design=...)`: its layout, lag, batching and trained-lag bound, no planner):
   its period once the pipeline has filled (steps from a quarter of the run on, the last left out) and its time to
   the reward target.
It prints, per design, price / period and the ranking's time to the target over the simulated one, and which design
the ranking puts first against the fastest simulated. Last line `design_regret: R`, over the presets the largest
simulated time to the target of the ranking's first over the fastest design's (1.0: the ranking, given the true
lengths, chose the fastest it knows).

Invariants (tests/bench/test_design_prices.py): a held design runs as priced (its layout, lookahead and batching, no
planner moves); a preset's rows cover every family the ranking offers, each once.
"""

from __future__ import annotations

import argparse

from bench.pipeline_law import filled_period_s
from bench.presets import PRESETS, SCENARIOS
from scheduler.design import Design, rank_designs
from scheduler.layout_model import Workload

PAPER = tuple((p, b) for p in ("paper_a800_48", "paper_910b3_160") for b in ("swe", "search", "math"))
QUICK = (("default", "search"),)
MAX_LAG = 4  # a comparison gives libra the lag range its tuned peers get (bench.sim_compare)


def family(d: Design) -> tuple[str, int]:
    return d.system, d.lag


def candidates(cfg, cost) -> list[Design]:
    """The ranking's best design of each family and lag on the run's finished lengths (a static run's)."""
    from sim.run import buckets_of, design_space_of, play_system

    stats: list = []
    play_system(cfg, "static", stats_out=stats)
    space = design_space_of(cfg, buckets_of(cfg), max_lag=MAX_LAG)
    firsts: dict[tuple[str, int], Design] = {}
    for d in rank_designs(cost, space, Workload.from_stats(stats), cfg.steps):  # best first: keep each family's first
        firsts.setdefault(family(d), d)
    return list(firsts.values())


def simulate(cfg, design: Design) -> dict:
    """`design` held fixed for the run: its filled period and its time to the reward target."""
    from sim.baselines import time_to_target
    from sim.run import play_system

    summary, rows, _, _ = play_system(cfg, "libra", design=design)
    return {"period_s": filled_period_s(rows)[1], "ttt_s": time_to_target(summary)}


def measure(preset: str, bench: str, seed: int = 0) -> dict:
    from bench.presets import get_preset
    from sim.run import cost_model_of

    cfg = get_preset(preset, bench, seed)
    cost = cost_model_of(cfg)
    rows = []
    for d in candidates(cfg, cost):  # ranked first to last
        sim = simulate(cfg, d)
        rows.append({"label": d.label, "price_s": d.step_s, "period_s": sim["period_s"],
                     "predicted_ttt_s": d.time_for(cfg.steps), "ttt_s": sim["ttt_s"]})
    best = min(rows, key=lambda r: r["ttt_s"])
    return {"preset": preset, "bench": bench, "rows": rows, "regret": rows[0]["ttt_s"] / best["ttt_s"],
            "fastest": best["label"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true", help="one small preset (the test's)")
    which.add_argument("--scenarios", action="store_true", help=f"the scenario presets ({', '.join(SCENARIOS)}) instead")
    args = p.parse_args()
    regret = 1.0
    print(f"{'preset':<24} {'design (ranked first to last)':<58} {'price s':>8} {'period s':>9} {'price/P':>8} "
          f"{'ttt s':>8} {'ranked ttt/sim':>14}")
    scenarios = tuple((n, PRESETS[n]().bench) for n in SCENARIOS)  # each on its own bench (training_heavy: math)
    for preset, bench in QUICK if args.quick else scenarios if args.scenarios else PAPER:
        m = measure(preset, bench, args.seed)
        for r in m["rows"]:
            print(f"{preset + ' ' + bench:<24} {r['label']:<58} {r['price_s']:>8.1f} {r['period_s']:>9.1f} "
                  f"{r['price_s'] / r['period_s']:>8.2f} {r['ttt_s']:>8.0f} {r['predicted_ttt_s'] / r['ttt_s']:>14.2f}")
        print(f"{'':<24} ranked first over the fastest ({m['fastest']}): {m['regret']:.3f}", flush=True)
        regret = max(regret, m["regret"])
    print("price/P: the ranking's step time over the simulated period; ranked ttt/sim: the ranking's time to the run's "
          "worth of progress over the simulated time to the reward target (only its order across designs matters)")
    print(f"design_regret: {regret:.3f}")


if __name__ == "__main__":
    main()
