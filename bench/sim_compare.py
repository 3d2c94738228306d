"""Simulated comparison of every system on one preset: `python -m bench.sim_compare [--preset NAME] [--bench swe]`.

Prints the table of `sim.run.format_table` (tokens/s, trajectories/s, ratios to colocate and to
the oracle, modelled time to the reward target, idle fractions) and a summary line per run:
libra over each baseline and each ablation (an ablation removes one mechanism, so a ratio below
1 says that mechanism costs more than it earns there), oracle/libra, libra over the best of a
few fixed static splits (`sim.run.static_splits`) beside libra over the default one, and the
trainer counts libra's planner moved through.
- `--all`: paper_a800_48 and paper_910b3_160 on the three workloads (the paper's headline figures).
- `--scenarios`: the workloads the scheduler must handle (`bench.presets.SCENARIOS`).
- `--seeds N`: every run for seeds seed..seed+N-1; the summary gives each ratio's mean and range
  (one seed's 20 steps move a ratio by a few percent: a mechanism's edge below that needs seeds).
- `--tune`: also run every baseline at its best configuration (`sim.baselines.tune`: every TP,
  split, bucket layout and staleness bound its own users could set, each one simulated) and
  report libra over each baseline's best (`l/X*`) beside libra over its default, with the
  configuration found; compare.json gains `tuned`: each peer's default, fastest and first-to-target
  runs with their configurations. This is the fair comparison; the defaults (TP1 everywhere) are
  kept only to show what tuning is worth. Libra's planner then chooses its own lag bound from the range the
  tuner tries for the continuous peers (`sim.baselines.STALENESS`: up to 4), not the preset's bound of 1.
  `l/best*` is libra over the fastest of all tuned baselines; `libra-partial/...` is libra with
  partial-rollout's finish-order batches (the tail no longer holds a step's batch); `hybrid*/best*`
  and `hybrid_tt/best*` are libra's time-shared hybrid layout (`libra-hybrid`, tuned over its TP as
  the peers are) over the fastest peer, in throughput and in time to the reward target.
Time to the reward target is printed beside throughput for libra and every peer (its default,
its fastest configuration and its configuration first to the target): `tt/X*` = X's best time to
the target over libra's (> 1: libra gets there first). The reward is a model (`sim/reward.py`):
a trajectory trained k versions late is worth gamma^k of a fresh one, gamma measured by real
training with forced lags (`python -m bench.convergence --lags 0,1,2,4`).
Every run writes compare.json/compare.png under `--out` (default `runs/sim-compare-<time>/`), one
folder per preset, bench and seed.
- `--peers-from DIR` (with `--tune`): the peers as a previous `--tune` run under DIR found and ran them
  (its compare.json per preset, bench and seed, same simulated setup), libra's own systems run again:
  libra, its ablations, libra-partial and the hybrid's tuning. Minutes instead of an hour for a change
  to libra; after a change to a peer or to the simulator, run the peers again.
A peer whose staleness bound bounds admission only (fully-async, partial-rollout) trains groups at lags past it
(partial-rollout at 4 trains up to lag 8-11 on 160 x 910B3); libra bounds the trained lag. So beside it,
`tt@lag/best*`: libra run with the trained lag of the peer first to the target (the summary's `staleness_max`) as
its bound, the same-bound comparison.
Last line with `--tune`: `libra_time_to_target_vs_best: R`, the best tuned peer's time to the reward
target over libra's (>= 1: libra is first), the worst over the presets of its mean over the seeds
(the lines before it: `libra_vs_best_baseline`, the same for throughput, and
`libra_time_to_target_vs_best_at_its_trained_lag`, the same for `tt@lag/best*`); without `--tune`:
`libra_vs_colocate: R` (of the last run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

from bench.presets import ABLATION_SYSTEMS, PRESETS, SCENARIOS, get_preset
from runlog import add_ratios
from scheduler import systems as sysmod
from scheduler.design import design_lag_cap
from sim.baselines import STALENESS, TUNED, Tuned, time_to_target, tune
from sim.run import all_systems, compare, format_table, play_system, static_splits

HYBRID = "libra-hybrid"  # libra's time-shared layout held fixed, tuned like the peers (libra's planner chooses among it and the rest)

BASELINES = ("colocate", "static", "verl-async", "fully-async", "partial-rollout", "length_aware", "la_mlfq")
ABLATIONS = tuple(s for s in ABLATION_SYSTEMS if s.startswith("libra-"))


def _trainers(desc: str) -> int:
    return int(desc.split("train=")[1].split()[0])


def first_s(t) -> float:
    """A tuned system's time to the target: its configuration first to it (else its fastest one)."""
    return time_to_target(t.to_target or t.best)


def best_of(tuned: dict) -> tuple[float | None, float]:
    """(the fastest tuned peer's tokens/s, the soonest tuned peer's time to the target); (None, inf) for none."""
    fastest = max((t.best["tokens_per_s"] for t in tuned.values()), default=None)
    return fastest, min((first_s(t) for t in tuned.values()), default=float("inf"))


def headline(result: dict, best_static: tuple[float, float] | None = None, tuned: dict | None = None) -> dict[str, float | str]:
    """Ratios of one compare (module docstring); `best_static`: (trainer share, tokens/s) of the best
    split; `tuned`: {baseline: Tuned} of `sim.baselines.tune`."""
    s = result["systems"]
    lib = s["libra"]["tokens_per_s"]
    out: dict[str, float | str] = {f"libra/{n}": lib / s[n]["tokens_per_s"] for n in BASELINES + ABLATIONS if n in s}
    for name, t in (tuned or {}).items():
        out[f"libra/{name}*"] = lib / t.best["tokens_per_s"]
    best, first = best_of(tuned or {})
    if best:
        out["libra/best*"] = lib / best
    if "libra-partial" in s:  # libra with finish-order batches: what its step barrier costs it
        out["libra-partial/libra"] = s["libra-partial"]["tokens_per_s"] / lib
        if best:
            out["libra-partial/best*"] = s["libra-partial"]["tokens_per_s"] / best
    if "oracle" in s:
        out["oracle/libra"] = s["oracle"]["tokens_per_s"] / lib
    # how far libra's planner misjudged its own steps (mean |forecast / measured - 1|; 0.2 = 20%)
    out["forecast_err"] = s["libra"].get("planner_forecast_error", float("nan"))
    # and of its mean step (|mean forecast / mean measured - 1|): a time-shared hybrid alternates long and short
    # steps about a mean the model prices, which the per-step error counts against it at every step
    pred, meas = s["libra"].get("planner_predicted_step_s"), s["libra"].get("planner_measured_step_s")
    out["forecast_mean_err"] = abs(pred / meas - 1) if pred and meas else float("nan")
    if best_static is not None:
        out["libra/best_static"] = lib / best_static[1]
        out["best_static_train_share"] = best_static[0]
    lib_t = time_to_target(s["libra"])
    for name, t in (tuned or {}).items():
        out[f"tt/{name}*"] = _ratio(first_s(t), lib_t)
    if tuned:
        out["tt/best*"] = _ratio(first, lib_t)
    return out


def _ratio(peer_s: float, libra_s: float) -> float:
    """peer's time to target over libra's: inf when only libra reaches it, nan when libra does not."""
    if libra_s == float("inf"):
        return float("nan")
    return peer_s / libra_s


def hybrid_headline(own: dict, tuned: dict) -> dict[str, float]:
    """libra-hybrid at its best TP over the fastest tuned peer: throughput (`hybrid*/best*`) and the best
    peer's time to the target over its own (`hybrid_tt/best*`, > 1: libra-hybrid first)."""
    if HYBRID not in own or not tuned:
        return {}
    t, (best, first) = own[HYBRID], best_of(tuned)
    return {"hybrid*/best*": t.best["tokens_per_s"] / best, "hybrid_tt/best*": _ratio(first, first_s(t))}


def planner_moves(result: dict) -> str:
    """Trainer ranks of libra's first and last layout (first -> last)."""
    lib = result["systems"]["libra"]
    return f"{_trainers(lib['role_map_first'])}->{_trainers(lib['role_map_last'])}"


def _runs(args) -> list[tuple[str, object]]:
    """(preset name, SimConfig) of every compare the arguments ask for, seed by seed."""
    out = []
    for seed in range(args.seed, args.seed + args.seeds):
        if args.all:
            out += [(pr, get_preset(pr, b, seed)) for pr in ("paper_a800_48", "paper_910b3_160")
                    for b in ("swe", "search", "math")]
        elif args.scenarios:
            out += [(name, PRESETS[name](seed=seed)) for name in SCENARIOS]  # each with its own bench
        else:
            out.append((args.preset, get_preset(args.preset, args.bench, seed)))
    if args.tune:  # libra's planner may choose its lag bound from the range the tuner gives the continuous peers
        out = [(name, cfg.replace(planner=dataclasses.replace(cfg.planner, max_lag=max(STALENESS)))) for name, cfg in out]
    return out


def print_summary(rows: list[tuple[str, str, dict, str]], num_seeds: int, paper_line: bool) -> None:
    """One line per (preset, bench): each ratio's mean over the seeds and, with several seeds, its range.

    The simulated cluster is deterministic but chaotic: one trajectory landing on a busier
    instance moves a 20-step run by a few percent, so ratios within that band need several seeds."""
    runs: dict[tuple[str, str], list[tuple[dict, str]]] = {}
    for preset, bench, h, moves in rows:
        runs.setdefault((preset, bench), []).append((h, moves))
    keys = list(dict.fromkeys(k for r in rows for k in r[2]))
    w = 12 if num_seeds < 2 else 17
    print(f"{'preset':<16} {'bench':<7} {'trainers':>8} " + " ".join(f"{k.replace('libra/', 'l/'):>{w}}" for k in keys))
    for (preset, bench), seen in runs.items():
        cells = []
        for k in keys:
            vals = [h[k] for h, _ in seen if k in h]
            mean = sum(vals) / len(vals) if vals else float("nan")
            cells.append(f"{mean:>{w}.2f}" if len(vals) < 2 else f"{f'{mean:.2f} ({min(vals):.2f}-{max(vals):.2f})':>{w}}")
        print(f"{preset:<16} {bench:<7} {seen[0][1]:>8} " + " ".join(cells))
    print("l/X = libra tok/s over X's; tt/X* = X's (tuned) modelled time to the reward target over libra's (> 1: libra "
          "first); an ablation (l/libra-...) below 1.00 means libra loses to itself without "
          "that mechanism" + (f"; mean (min-max) over {num_seeds} seeds, trainers of the first seed" if num_seeds > 1 else ""))
    if paper_line:
        print("paper (arXiv 2606.03077): up to 3.0x-4.2x throughput, 2.5x-2.7x faster reward convergence")


def _staleness_of(label: str) -> int | None:
    return int(label.split("staleness=")[1].split()[0]) if "staleness=" in label else None


def print_tuned(cfg, result: dict, tuned: dict) -> dict[str, float]:
    """Each baseline's default and best configuration, and libra over both. Where a peer's best runs
    at another staleness bound than the preset's, libra is run at that bound too (`l@s/best`): a
    throughput gain bought with staleness is not a scheduling win. Returns those ratios."""
    lib = result["systems"]["libra"]["tokens_per_s"]
    lib_t = time_to_target(result["systems"]["libra"])
    matched: dict[tuple[str, int], float] = {}
    extra = {}
    first, last = result["systems"]["libra"].get("design_first"), result["systems"]["libra"].get("design")
    print(f"libra: {lib:.0f} tok/s, time to the reward target {_secs(lib_t)} (modelled reward, sim/reward.py)"
          + (f"; design before step 1: {first}" if first else "") + (f", on the measured lengths: {last}" if last != first else ""))
    print(f"{'baseline':<16} {'default tok/s':>13} {'best tok/s':>11} {'l/default':>9} {'l/best':>7} {'l@s/best':>9} "
          f"{'ttt best-tok/s':>14} {'ttt first':>10} {'tt/X*':>6}  best configuration (first to target)")
    for name, t in tuned.items():
        eta = _staleness_of(t.best_label)
        same = ""
        if eta is not None and eta != cfg.max_staleness:
            # libra, and libra with finish-order batches where the peer batches that way, at the peer's bound
            for mine in ("libra", "libra-partial") if sysmod.get_system(name).batch_by_finish else ("libra",):
                if (mine, eta) not in matched:
                    matched[mine, eta] = play_system(cfg.replace(max_staleness=eta), mine)[0]["tokens_per_s"]
                extra[f"{mine}@s/{name}*"] = matched[mine, eta] / t.best["tokens_per_s"]
            same = f"{extra[f'libra@s/{name}*']:.2f}"
        print(f"{name:<16} {t.default['tokens_per_s']:>13.0f} {t.best['tokens_per_s']:>11.0f} "
              f"{lib / t.default['tokens_per_s']:>9.2f} {lib / t.best['tokens_per_s']:>7.2f} {same:>9} "
              f"{_secs(time_to_target(t.best)):>14} {_secs(first_s(t)):>10} "
              f"{_ratio(first_s(t), lib_t):>6.2f}  {t.best_label} ({t.to_target_label})")
    extra.update(at_trained_lag(cfg, lib_t, {n: t for n, t in tuned.items() if n != HYBRID}))
    return extra


def at_trained_lag(cfg, libra_s: float, tuned: dict) -> dict[str, float]:
    """The peer first to the target trained tokens up to some lag (its admission bound alone does not bound it):
    libra with that trained-lag bound, its time to the target over the peer's (`tt@lag/best*`, the same-bound
    comparison; libra's own bound where the peer's lag is within it). {} where the stored peer has no lag record."""
    if not tuned:
        return {}
    name = min(tuned, key=lambda n: first_s(tuned[n]))
    lag = (tuned[name].to_target or tuned[name].best).get("staleness_max")
    if lag is None:
        return {}
    mine = libra_s
    if lag > design_lag_cap(cfg.planner, cfg.max_staleness):
        mine = time_to_target(play_system(cfg.replace(planner=dataclasses.replace(cfg.planner, max_lag=lag)), "libra")[0])
    ratio = _ratio(first_s(tuned[name]), mine)
    print(f"libra at the trained lag of the peer first to the target ({name}, up to lag {lag}): {_secs(mine)}, "
          f"tt@lag/best* {ratio:.2f}")
    return {"tt@lag/best*": ratio}


def tuned_record(tuned: dict) -> dict:
    """compare.json's `tuned`: each peer's default, fastest and first-to-target runs and what it tried."""
    return {name: {"default": t.default, "best_label": t.best_label, "best": t.best,
                   "to_target_label": t.to_target_label, "to_target": t.to_target or t.best,
                   "tried": [{"label": label, "predicted_step_s": pred, "tokens_per_s": tps} for label, pred, tps in t.tried]}
            for name, t in tuned.items()}


def libras_own(name: str) -> bool:
    """Whether `name` is one of libra's own systems (libra, its ablations, libra-partial, libra-hybrid): what
    `--peers-from` runs again."""
    return name.startswith("libra")


def stored_peers(path: Path, cfg) -> tuple[dict, dict]:
    """(the stored run's summaries of every system not libra's own, {peer: Tuned}) from a `--tune` run's
    compare.json at `path`, which must have simulated `cfg`'s setup (its planner settings aside: libra's)."""
    if not path.is_file():
        raise SystemExit(f"--peers-from: {path} is missing; run `python -m bench.sim_compare` with --tune and the same "
                         f"presets and seeds (--out DIR) first")
    stored = json.loads(path.read_text())
    mine, theirs = ({k: v for k, v in c.items() if k != "planner"} for c in (cfg.to_dict(), stored["config"]))
    if mine != theirs or "tuned" not in stored:
        diff = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        raise SystemExit(f"--peers-from: {path} simulated another setup (differs in {diff or ['no --tune record']}); "
                         "run the peers again without --peers-from")
    peers = {n: v for n, v in stored["systems"].items() if not libras_own(n)}
    tuned = {n: Tuned(n, r["default"], r["best"], r["best_label"],
                      [(t["label"], t["predicted_step_s"], t["tokens_per_s"]) for t in r["tried"]],
                      r["to_target"], r["to_target_label"])
             for n, r in stored["tuned"].items() if n in TUNED}
    return peers, tuned


def compare_libra(cfg, systems: list[str] | None, out: Path, peers: dict) -> dict:
    """`compare` of libra's own systems (every requested one whose name starts with libra), the others as stored."""
    names = list(systems) if systems else all_systems()
    missing = [n for n in names if not libras_own(n) and n not in peers]
    if missing:
        raise SystemExit(f"--peers-from: the stored run has no {missing}; run them again without --peers-from")
    result = compare(cfg, [n for n in names if libras_own(n)], out)
    result["systems"] = {n: result["systems"][n] if libras_own(n) else peers[n] for n in names}
    add_ratios(result["systems"])
    return result


def worst_mean(rows: list[tuple[str, str, dict, str]], key: str) -> float:
    """The lowest over (preset, bench) of `key`'s mean over the seeds (nan where libra never reached the target)."""
    runs: dict[tuple[str, str], list[float]] = {}
    for preset, bench, h, _ in rows:
        runs.setdefault((preset, bench), []).append(h.get(key, math.nan))
    means = [sum(v) / len(v) for v in runs.values()]
    return min(means) if means and not any(math.isnan(m) for m in means) else math.nan


def _secs(t: float) -> str:
    return "never" if t == float("inf") else f"{t:.0f} s"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="default", choices=sorted(PRESETS))
    p.add_argument("--bench", default="swe", choices=("swe", "search", "math"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=1, help="run seeds seed..seed+N-1 and report each ratio's mean and range")
    p.add_argument("--systems", default="", help="comma-separated; empty = every system + oracle")
    p.add_argument("--out", default="", help="directory for compare.json/compare.png (default runs/sim-compare-<time>)")
    p.add_argument("--tune", action="store_true", help="also run each baseline at its best configuration (l/X*)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="paper_a800_48 and paper_910b3_160 on all three benches")
    which.add_argument("--scenarios", action="store_true", help=f"the scenario presets: {', '.join(SCENARIOS)}")
    p.add_argument("--peers-from", default="", help="with --tune: the peers as a previous --tune run's --out dir has "
                                                    "them; only libra's own systems run again")
    args = p.parse_args()
    if args.seeds < 1:
        p.error(f"--seeds {args.seeds}: give at least 1")
    if args.peers_from and not args.tune:
        p.error("--peers-from reuses a --tune run's tuned peers: give --tune too")
    systems = [s for s in args.systems.split(",") if s] or (ABLATION_SYSTEMS if args.preset == "ablation" else None)
    rows, result = [], None
    root = Path(args.out or f"runs/sim-compare-{time.strftime('%Y%m%d-%H%M%S')}")
    for preset, cfg in _runs(args):
        t0 = time.perf_counter()
        out = root / f"{preset}-{cfg.bench}-seed{cfg.seed}"
        stored = stored_peers(Path(args.peers_from) / out.name / "compare.json", cfg) if args.peers_from else None
        result = compare_libra(cfg, systems, out, stored[0]) if stored else compare(cfg, systems, out)
        best = None
        if args.all or args.scenarios:
            splits = static_splits(cfg)
            share = max(splits, key=lambda f: splits[f]["tokens_per_s"])
            best = (share, splits[share]["tokens_per_s"])
        print(format_table(result))
        tuned = {}
        if args.tune:
            tuned = ({n: t for n, t in stored[1].items() if n in result["systems"]} if stored else
                     {name: tune(cfg, name) for name in TUNED if name in result["systems"]})
            own = {HYBRID: tune(cfg, HYBRID)} if HYBRID in result["systems"] else {}
            matched = print_tuned(cfg, result, {**tuned, **own})
            result["tuned"] = tuned_record({**tuned, **own})
            (out / "compare.json").write_text(json.dumps(result, indent=2))
        print(f"({preset}/{cfg.bench} seed {cfg.seed}: {time.perf_counter() - t0:.1f} s on this host)\n")
        if "libra" in result["systems"]:
            h = headline(result, best, tuned)
            if args.tune:
                h.update(matched)
                h.update(hybrid_headline(own, tuned))
            rows.append((preset, cfg.bench, h, planner_moves(result)))
    if rows and (args.all or args.scenarios or args.seeds > 1):
        print_summary(rows, args.seeds, paper_line=args.all)
    print(f"wrote {root}/")
    if args.tune and rows:
        print(f"libra_vs_best_baseline: {worst_mean(rows, 'libra/best*'):.2f}")
        if any("hybrid_tt/best*" in h for _, _, h, _ in rows):
            print(f"libra_hybrid_time_to_target_vs_best: {worst_mean(rows, 'hybrid_tt/best*'):.2f}")
        if any("tt@lag/best*" in h for _, _, h, _ in rows):
            print(f"libra_time_to_target_vs_best_at_its_trained_lag: {worst_mean(rows, 'tt@lag/best*'):.2f}")
        print(f"libra_time_to_target_vs_best: {worst_mean(rows, 'tt/best*'):.2f}")
        return
    ratio = result["systems"].get("libra", {}).get("vs_colocate")
    print(f"libra_vs_colocate: {ratio if ratio is not None else float('nan'):.2f}")


if __name__ == "__main__":
    main()
