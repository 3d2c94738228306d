"""Entry points of the simulator: `simulate` one system, `compare` all of them, `replay` a real run.

Algorithm of `simulate(cfg, system)`:
1. cost model = `scheduler.costmodel.get_cost_model(cfg.hardware, cfg.model)`; workload = the
   bench profile (with `cfg.workload_overrides`) or a recorded trace (`cfg.trace_dir`).
2. router, planner and initial role map come from `scheduler/systems.py` exactly as the real
   runtime builds them; `oracle` keeps the fastest of its candidate schedules: the clairvoyant
   router of `sim/oracle.py` with longest-first admission, free sync and free reconfiguration
   over the planners/pipelines of `ORACLE_BASES` and, in `compare`, over every layout another
   system ran on (held fixed; the oracle knows the workload, so it needs no planner), and
   libra's own schedule as it is: the greedy clairvoyant placement is a heuristic that C-MLFQ
   can beat on a small run, and the yardstick is the best schedule known (free sync alone does
   not make a schedule faster: it shifts every later routing decision).
3. `sim/cluster.py` plays S steps through the runtime's own step core, which writes docs/design.md's
   metrics rows; `runlog.summarize` turns them into the summary (reward: `sim/reward.py`'s model).
`compare` runs every system on the same workload and seed and writes compare.json/compare.png.
`replay(run_dir)` plays a real run's recorded trajectories (`sim/trace.py`) through the same
system and compares the predicted step times with the measured `step_s` (mean abs. % error).

Invariants (tests/sim/test_sim_run.py): same config and seed -> identical summaries (except host
timings); tokens and trajectories are equal across systems; no step-batched system beats
`oracle` (finish-order systems train other batches, so its step schedule does not bound them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from runlog import add_ratios, format_table, peak_rss_mb, plot_compare, summarize, trajectory_lags
from scheduler import systems as sysmod
from scheduler.costmodel import get_cost_model
from scheduler.design import Design, DesignSpace, design_space, rank_designs
from scheduler.design_planner import DesignPlanner
from scheduler.layout import MAX_SEQS_PER_INSTANCE, BucketsConfig, RoleMap
from scheduler.planner import PlannerConfig
from scheduler.profile import load_cost_model
from scheduler.routers import RouterConfig
from scheduler.systems import SYSTEMS
from sim.cluster import ClusterSim
from sim.config import SimConfig, buckets_of, default_router, from_libra_config
from sim.oracle import OracleRouter
from sim.reward import MEASURED_LAG_GAMMA, MEASURED_LAG_SOURCE, REWARD_NOTE, RewardTracker, curve_for, default_target
from sim.trace import TraceWorkload, write_trajectories
from sim.workload import PROFILES, SyntheticWorkload, get_profile, prior_workload

__all__ = ["simulate", "compare", "replay", "play_system", "static_splits", "format_table", "all_systems", "SimConfig"]
log = logging.getLogger(__name__)

ORACLE = "oracle"


@dataclass(frozen=True, kw_only=True)
class SystemParts:
    router: object
    planner: object | None
    role_map: RoleMap
    lookahead: int  # steps admitted ahead of the trainer (scheduler.systems.lookahead_of)
    colocated: bool
    oracle: bool = False
    batch_by_finish: bool = False
    interrupt_on_update: bool = False
    max_staleness: int | None = None  # the design's lag bound (None: the config's)
    elastic: bool = False  # idle rollout instances may help train (SystemSpec.elastic; the planner chooses them)
    bound_trained_lag: bool = False  # finish-order batches bound the trained lag, not only admission (libra's designs)
    design: str | None = None  # the design libra's planner chose (`choose_design`), for the summary


def make_workload(cfg: SimConfig):
    if cfg.trace_dir is not None:
        return TraceWorkload.load(Path(cfg.trace_dir))
    profile = get_profile(cfg.bench, **dict(cfg.workload_overrides))
    return SyntheticWorkload(profile, seed=cfg.seed, num_steps=cfg.steps, num_dataset_prompts=cfg.dataset_prompts)


def all_systems() -> list[str]:
    names = list(SYSTEMS)
    return names + ([ORACLE] if ORACLE not in names else [])


@dataclass(frozen=True)
class RealSetup:
    """A real run's own settings, so a replay plays the run as configured (bench/fidelity.py)."""

    role_map: RoleMap  # the run's first layout
    buckets: BucketsConfig
    router: RouterConfig
    planner: PlannerConfig


def build_system(system: str, cfg: SimConfig, cost, *, clairvoyant: bool = False, real: RealSetup | None = None,
                 design: Design | None = None) -> SystemParts:
    """The system's router, planner and first layout; `clairvoyant` swaps in the oracle's router; `design`: a design of
    libra's (scheduler/design.py) held for the whole run, without a planner (`bench.design_prices` prices each)."""
    spec = sysmod.get_system(system)
    if real is not None:
        planner = sysmod.make_planner(system, real.role_map.world_size, cost, cfg.steps, cfg=real.planner,
                                      current=real.role_map, buckets=real.buckets, max_staleness=cfg.max_staleness)
        return SystemParts(router=sysmod.make_router(system, real.router), planner=planner, role_map=real.role_map,
                           lookahead=sysmod.lookahead_of(system, cfg.max_staleness), colocated=bool(real.role_map.colocated),
                           oracle=False, batch_by_finish=spec.batch_by_finish,
                           interrupt_on_update=spec.interrupt_on_update, elastic=spec.elastic,
                           bound_trained_lag=spec.chooses_design and real.planner.bound_trained_lag)
    rcfg = cfg.router if cfg.router is not None else default_router(cfg)
    buckets = buckets_of(cfg)
    # The planner plans for the batch cap the simulated engines enforce (per instance, as vLLM's max_num_seqs).
    pcfg = dataclasses.replace(cfg.planner, max_batch=cfg.max_seqs_per_instance)
    held = design is not None
    if not held:
        design = choose_design(cfg, cost, buckets) if spec.chooses_design and not clairvoyant else None
    if design is not None:
        planner = None if held else sysmod.make_planner(
            system, cfg.num_devices, cost, cfg.steps, cfg=pcfg, current=design.role_map, buckets=buckets,
            max_staleness=cfg.max_staleness, group_size=cfg.samples_per_prompt, design=design, gamma=cfg.lag_gamma)
        # libra's own router (C-MLFQ) under every design, as the real runtime runs it: on a colocated layout
        # (one bucket) it admits to the least-loaded instance and never migrates
        return SystemParts(router=sysmod.make_router(system, rcfg), role_map=design.role_map, planner=planner,
                           lookahead=design.lookahead, colocated=design.role_map.colocated,
                           batch_by_finish=design.batch_by_finish, max_staleness=design.max_staleness, design=design.label,
                           elastic=spec.elastic, bound_trained_lag=cfg.planner.bound_trained_lag)
    role_map = sysmod.initial_role_map(system, cfg.num_devices, cost_model=cost, buckets=buckets)
    planner = sysmod.make_planner(system, cfg.num_devices, cost, cfg.steps, cfg=pcfg, current=role_map, buckets=buckets,
                                  max_staleness=cfg.max_staleness)
    router = OracleRouter(cost, cfg.max_seqs_per_instance) if clairvoyant else sysmod.make_router(system, rcfg)
    return SystemParts(router=router, planner=planner, role_map=role_map, lookahead=sysmod.lookahead_of(system, cfg.max_staleness),
                       colocated=bool(role_map.colocated), oracle=clairvoyant, batch_by_finish=spec.batch_by_finish,
                       interrupt_on_update=spec.interrupt_on_update, elastic=spec.elastic,
                       bound_trained_lag=spec.chooses_design and cfg.planner.bound_trained_lag)


def design_space_of(cfg: SimConfig, buckets: BucketsConfig, *, max_lag: int | None = None) -> DesignSpace:
    """What libra's designs may use on `cfg`'s cluster (`scheduler.design.design_space`), its engines' batch cap as
    build_system's; `max_lag`: a lag range other than the config's planner's."""
    planner = dataclasses.replace(cfg.planner, max_batch=cfg.max_seqs_per_instance,
                                  max_lag=cfg.planner.max_lag if max_lag is None else max_lag)
    return design_space(world_size=cfg.num_devices, buckets=buckets.buckets(), planner=planner,
                        max_staleness=cfg.max_staleness, group_size=cfg.samples_per_prompt, gamma=cfg.lag_gamma)


def choose_design(cfg: SimConfig, cost, buckets: BucketsConfig) -> Design | None:
    """Libra's design before step 1 (scheduler/design.py), on the bench's prior (`sim.workload.prior_workload`:
    its default profile, not the preset's overrides nor its seed); the planner re-checks it on the run's own
    lengths (scheduler/design_planner.py). None when the bench declares no prior (a trace or a profile file): the
    split design, as before."""
    prior = prior_workload(cfg.bench, trajectories_per_step=cfg.prompts_per_step * cfg.samples_per_prompt,
                           samples_per_prompt=cfg.samples_per_prompt, train_epochs=cfg.train_epochs)
    if prior is None or cfg.trace_dir is not None:
        return None
    ranked = rank_designs(cost, design_space_of(cfg, buckets), prior, cfg.steps)
    log.info("[libra sim] design before step 1: %s", "; ".join(f"{d.label} {d.step_s:.0f}s/step rate {d.rate * 1e3:.2f}"
                                                               for d in ranked[:4]))
    return ranked[0]


# Standalone, the oracle's schedule is the best clairvoyant one over these planners/pipelines; in
# `compare` it also tries, as fixed layouts, the layouts every other system ran on.
ORACLE_BASES = ("libra", "libra-homogeneous", "static", "colocate", "libra-hybrid")


def _play(cfg: SimConfig, system: str, cost, record: bool, clairvoyant: bool = False, fixed: RoleMap | None = None,
          real: RealSetup | None = None, design: Design | None = None):
    """One schedule; `clairvoyant`: the oracle's router, longest-first admission, free sync and reconfiguration."""
    parts = build_system(system, cfg, cost, clairvoyant=clairvoyant, real=real, design=design)
    if parts.max_staleness is not None:
        cfg = cfg.replace(max_staleness=parts.max_staleness)
    if fixed is not None:
        parts = dataclasses.replace(parts, planner=None, role_map=fixed, colocated=fixed.colocated,
                                    lookahead=sysmod.lookahead_of(system, cfg.max_staleness, colocated=fixed.colocated))
    sim = ClusterSim(cfg=cfg, cost=cost, workload=make_workload(cfg), router=parts.router, planner=parts.planner,
                     role_map=parts.role_map, lookahead=parts.lookahead, longest_first=clairvoyant,
                     clairvoyant=clairvoyant, free_sync=clairvoyant, free_reconfig=clairvoyant, record=record,
                     batch_by_finish=parts.batch_by_finish, interrupt_on_update=parts.interrupt_on_update,
                     elastic=parts.elastic, bound_trained_lag=parts.bound_trained_lag)
    with _sparse_gc():
        sim.run()
    return sim.layouts, parts, sim


@contextlib.contextmanager
def _sparse_gc(gen0: int = 50_000):
    """Collect garbage cycles less often during a run: it allocates millions of short-lived objects
    over a large live heap, and the default thresholds spent a quarter of a 1,024-device run in
    the collector (66.6 -> 51 s with it off). Memory is unchanged (peak 534 MB either way)."""
    old = gc.get_threshold()
    gc.set_threshold(gen0, 50, 50)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def _layout_key(rm: RoleMap) -> tuple:
    return (len(rm.trainer_ranks), rm.colocated, tuple(sorted((i.bucket, i.tp) for i in rm.instances)),
            tuple((b.name, b.max_tokens) for b in rm.buckets))


def layouts_used(layouts: list[RoleMap]) -> list[RoleMap]:
    """The layouts a run spent most steps on and ended with (deduplicated), for the oracle to try."""
    counts: dict[tuple, list] = {}
    for rm in layouts:
        counts.setdefault(_layout_key(rm), [0, rm])[0] += 1
    most = max(counts.values(), key=lambda c: c[0])[1]
    last = layouts[-1]
    return [most] if _layout_key(most) == _layout_key(last) else [most, last]


def _candidates(system: str, extra_layouts) -> list[tuple[str, RoleMap | None, bool]]:
    """(base system, fixed layout or None, clairvoyant router) of each schedule `system` tries."""
    if system != ORACLE:
        return [(system, None, False)]
    seen, out = set(), [(b, None, True) for b in ORACLE_BASES] + [("libra", None, False)]
    for rm in extra_layouts:
        if _layout_key(rm) not in seen:
            seen.add(_layout_key(rm))
            out.append(("libra", rm, True))
    return out


def cost_model_of(cfg: SimConfig):
    """The measured profile's cost model when the config names one, else the analytic tables."""
    return load_cost_model(cfg.profile) if cfg.profile else get_cost_model(cfg.hardware, cfg.model)


def play_system(cfg: SimConfig, system: str, record: bool = False, oracle_layouts=(),
                real: RealSetup | None = None, layout: RoleMap | None = None,
                stats_out: list | None = None, design: Design | None = None) -> tuple[dict, list[dict], list, list]:
    """(summary, metrics rows, admitted requests, layouts worth trying) of one simulated system;
    `layout`: hold this role map for the whole run instead of the system's first layout and planner;
    `design`: hold this design of libra's (`system` libra) instead of choosing and re-planning one;
    `stats_out`: receives the run's StepStats (what a planner would have seen)."""
    t0 = time.perf_counter()
    cost = cost_model_of(cfg)
    curve = curve_for(cfg.bench, cfg.steps)
    target = cfg.reward_target if cfg.reward_target is not None else default_target(curve, cfg.steps)
    best = None
    candidates = _candidates(system, oracle_layouts) if layout is None else [(system, layout, False)]
    for base, fixed, clairvoyant in candidates:
        layouts, parts, sim = _play(cfg, base, cost, record, clairvoyant=clairvoyant, fixed=fixed, real=real, design=design)
        if best is None or sim.rows[-1]["time_s"] < best[2].rows[-1]["time_s"]:
            source = base if fixed is None else "fixed " + fixed.describe()
            best = (layouts, parts, sim, source if clairvoyant or system != ORACLE else source + " (own router)")
    layouts, parts, sim, source = best
    if stats_out is not None:
        stats_out.extend(sim.stats)
    tracker = RewardTracker(curve, cfg.lag_gamma)
    # the simulator trains nothing: its reward is the documented model of training progress
    metrics = [{**row, "reward_mean": tracker.step(trajectory_lags(row))} for row in sim.rows]
    summary = summarize(metrics, bench=cfg.bench, system=system, mode="sim", wall_s=metrics[-1]["time_s"],
                        dropped=sim.core.ledger.counts()["dropped"], peak_rss_mb=peak_rss_mb(),
                        reward_target=target, sim_wall_s=time.perf_counter() - t0, note=REWARD_NOTE,
                        lag_gamma=cfg.lag_gamma, lag_gamma_source=MEASURED_LAG_SOURCE if cfg.lag_gamma == MEASURED_LAG_GAMMA else "SimConfig")
    if system == ORACLE:
        summary["oracle_schedule_from"] = source
    if parts.design:  # libra: the design chosen before step 1, and the one it ended on
        summary["design_first"] = parts.design
        summary["design"] = parts.planner.design.label if isinstance(parts.planner, DesignPlanner) else parts.design
    log.info("[libra sim] %s/%s: %.0f tok/s over %.0f simulated s (%.2f s on the host)",
             cfg.bench, system, summary["tokens_per_s"], summary["wall_s"], summary["sim_wall_s"])
    return summary, metrics, sim.admitted or [], layouts_used(layouts)


def _write_run(out_dir: Path, cfg: SimConfig, system: str, summary: dict, metrics: list[dict], admitted=()) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps({"mode": "sim", "system": system, "sim": cfg.to_dict()}, indent=2))
    with open(out_dir / "metrics.jsonl", "w") as f:
        for m in metrics:
            f.write(json.dumps(m) + "\n")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if admitted:
        write_trajectories(out_dir / "trajectories.jsonl", admitted)


def simulate(cfg: SimConfig, system: str, out_dir: Path | None = None) -> dict:
    """Simulate one system; with `out_dir`, write config.json, metrics.jsonl, summary.json there,
    and the run's trajectories.jsonl in the real runtime's trace format (replayable)."""
    summary, metrics, admitted, _ = play_system(cfg, system, record=out_dir is not None)
    if out_dir is not None:
        _write_run(Path(out_dir), cfg, system, summary, metrics, admitted)
    return summary


def compare(cfg: SimConfig, systems: list[str] | None, out_dir: Path | None) -> dict:
    """Every system on the same workload and seed; writes compare.json and compare.png to `out_dir`."""
    names = list(systems) if systems else all_systems()
    results, layouts = {}, []
    # the oracle runs last: it tries every layout the other systems ran on
    for name in sorted(names, key=lambda n: n == ORACLE):
        summary, metrics, _, used = play_system(cfg, name, oracle_layouts=layouts)
        layouts.extend(used)
        results[name] = summary
        if out_dir is not None:
            _write_run(Path(out_dir) / name, cfg, name, summary, metrics)
    results = {n: results[n] for n in names}
    add_ratios(results)
    out = {
        "bench": cfg.bench,
        "mode": "sim",
        "setup": f"{cfg.num_devices}x{cfg.hardware} {cfg.model} steps={cfg.steps} "
                 f"batch={cfg.prompts_per_step}x{cfg.samples_per_prompt} seed={cfg.seed}",
        "config": cfg.to_dict(),
        "note": REWARD_NOTE,
        "systems": results,
    }
    if out_dir is not None:
        out_dir = Path(out_dir)
        (out_dir / "compare.json").write_text(json.dumps(out, indent=2))
        plot_compare(out, out_dir / "compare.png")
    return out


STATIC_TRAINER_FRACTIONS = (0.25, 0.375, 0.5, 0.625, 0.75)


def static_splits(cfg: SimConfig, fractions=STATIC_TRAINER_FRACTIONS) -> dict[float, dict]:
    """`static` at several fixed trainer shares (0.5 is the default `static`): summary per share,
    so libra can be set beside the best fixed split a user could have found by hand."""
    cost, buckets = cost_model_of(cfg), buckets_of(cfg)
    out = {}
    for f in fractions:
        rm = sysmod.initial_role_map("static", cfg.num_devices, cost_model=cost, buckets=buckets, trainer_frac=f)
        out[f] = play_system(cfg, "static", layout=rm)[0]
    return out


def run_from_libra_config(cfg, out_dir: Path, given=()) -> int:
    """`python libra.py --bench B --sim [--compare] [--system S] [--seed N] [--out DIR] [flags]`: the default
    preset with the flags given (`given`: their dotted keys) that mean something in the simulator
    (sim/config.py `from_libra_config`; the others are refused)."""
    if cfg.run.bench not in PROFILES:
        raise ValueError(f"--sim has no workload profile for bench {cfg.run.bench!r}; use one of {sorted(PROFILES)}")
    sim_cfg = from_libra_config(cfg, given)
    out_dir = Path(out_dir)
    if cfg.run.compare:
        result = compare(sim_cfg, list(cfg.run.compare_systems) or None, out_dir)
        print(format_table(result))
        print(f"wrote {out_dir / 'compare.json'} and {out_dir / 'compare.png'}")
        if result["systems"].get("libra", {}).get("vs_colocate") is not None:
            print(f"libra_vs_colocate: {result['systems']['libra']['vs_colocate']:.2f}")
        return 0
    summary = simulate(sim_cfg, cfg.run.system, out_dir)
    print(f"{cfg.run.system} (sim): {summary['tokens_per_s']:.0f} tok/s, {summary['trajectories_per_s']:.3f} traj/s; "
          f"wrote {out_dir}")
    return 0


def replay(run_dir: Path, *, system: str, num_devices: int, hardware: str = "cpu", model: str = "tiny",
           max_staleness: int = 1, max_seqs_per_instance: int = MAX_SEQS_PER_INSTANCE, profile: str | None = None,
           real: RealSetup | None = None, **sim_kw) -> dict:
    """Predicted vs measured step times of a recorded run (see the module docstring).

    `profile`: a measured HardwareProfile instead of the (hardware, model) tables; `real`: the run's
    own first layout, buckets, router and planner settings (bench/fidelity.py reads them from its
    config.json), so the simulator plays the run as it was configured; `sim_kw`: other SimConfig
    fields (prompts_per_step, samples_per_prompt, ...)."""
    run_dir = Path(run_dir)
    measured = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    wl = TraceWorkload.load(run_dir)
    steps = min(wl.num_steps, len(measured))
    cfg = SimConfig(bench=wl.name, hardware=hardware, model=model, num_devices=num_devices, steps=steps,
                    max_staleness=max_staleness, max_seqs_per_instance=max_seqs_per_instance, trace_dir=str(run_dir),
                    profile=profile, **sim_kw)
    summary, metrics, _, _ = play_system(cfg, system, real=real)
    pairs = [(m["step_s"], p["step_s"]) for m, p in zip(measured[:steps], metrics)]
    errors = [abs(p - m) / m for m, p in pairs if m > 0]
    return {
        "system": system, "hardware": hardware, "model": model, "steps": steps, "profile": profile,
        "measured_step_s": [m for m, _ in pairs], "predicted_step_s": [p for _, p in pairs],
        "measured": measured[:steps], "predicted": metrics,
        "mape": sum(errors) / len(errors) if errors else 0.0,
        "measured_total_s": sum(m for m, _ in pairs), "predicted_total_s": summary["wall_s"],
    }
