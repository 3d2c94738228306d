"""A real run end to end: placement, spawning the coordinator and workers, the summary.

`plan_placement` resolves the device, the TP degrees the model can split (into the config's
`planner.allowed_tp`) and the first role map (from `scheduler/systems.py`); `run` resolves the
planner's cost model (`cost_model_for`), writes config.json, spawns world = workers + 1 ranks
(rank 0 coordinates, with the config and cost model the launcher resolved: it resolves neither
again), and prints the summary. `--resume DIR` restarts from the newest complete
checkpoint of DIR with its role map and step. A stop signal that the ranks finish in time still
writes the summary (with `stopped_by`) and says how to resume.

Invariants (tests/engine/runtime/test_e2e.py): summary.json and metrics.jsonl follow docs/design.md; a failing rank
ends the run non-zero with its rank and role named.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from engine.runtime import checkpoint
from engine.devices import DeviceInfo, detect, peak_memory_mb, rank_device
from engine.runtime.launch import RankContext, WorkerFailed, run_in_torchrun, spawn
from runlog import RunWriter, plot_run, read_metrics, run_story
from scheduler.layout import RoleMap
from steps.commands import RunState

log = logging.getLogger("libra")


def valid_tp_degrees(cfg) -> tuple[int, ...]:
    """TP degrees the planner allows and the model can split (heads, kv heads, MLP width divisible)."""
    from engine.rollout.tp import check_tp_degree
    from engine.models import load_config

    hf = load_config(cfg.run.model)
    ok, why = [], ""
    for tp in cfg.planner.allowed_tp:
        try:
            check_tp_degree(hf, tp)
            ok.append(tp)
        except ValueError as exc:
            why = why or str(exc).split(";")[0]
    if not ok:
        allowed = ",".join(map(str, cfg.planner.allowed_tp))
        raise ValueError(f"--planner.allowed-tp {allowed}: the model {cfg.run.model!r} splits at none of these degrees "
                         f"({why}); add 1, or a degree that divides them, to --planner.allowed-tp")
    return tuple(ok)


def cost_model_for(cfg, info: DeviceInfo):
    """The planner's cost model, by `--planner.profile`: this machine's measured profile (auto, refresh:
    measured once per model and machine and cached, engine/runtime/profile_cache.py), a profile file, or the
    analytic tables (none; and auto on a device engine.runtime.profile cannot measure). Logs one line saying which.

    Cheap once the profile is cached; a miss measures (~1 minute for smollm2 on 2 cores), so the launcher
    calls this once, before the ranks start (the workers wait for the coordinator's first role map for at
    most --launch.timeout-s), and hands the result to the coordinator."""
    from scheduler.profile import ProfiledCostModel, load_cost_model
    from scheduler.systems import get_system

    if not get_system(cfg.run.system).planner:  # nothing plans: measure nothing, say nothing
        return _analytic_cost_model(cfg.run.model, info.kind)
    mode = cfg.planner.profile or "none"
    if _plans_on_this_machine(cfg, info.kind):
        from engine.runtime.profile_cache import cached_profile

        path, profile, how = cached_profile(cfg.run.model, info.kind, refresh=mode == "refresh")
        log.info("[libra] planner costs: this machine's profile %s (%s; --planner.profile refresh measures again, "
                 "none plans on the analytic tables)", path, how)
        return ProfiledCostModel(profile)
    if mode not in ("auto", "refresh", "none"):
        cost = load_cost_model(mode)
        if cost.profile.model != cfg.run.model or cost.profile.device != info.kind:
            raise ValueError(f"--planner.profile {mode} measured {cost.profile.model} on {cost.profile.device}, "
                             f"but this run is {cfg.run.model} on {info.kind}; profile this setup with "
                             f"`python -m engine.runtime.profile --model {cfg.run.model}`, or pass --planner.profile auto")
        log.info("[libra] planner costs: the profile %s", mode)
        return cost
    cost = _analytic_cost_model(cfg.run.model, info.kind)
    if info.kind == "cpu":  # the tables treat each rank as a device of its own; here they share the cores
        cost.prices_split = False  # the planner keeps the trainer/rollout split (scheduler/planner.py, 5.)
        log.info("[libra] planner costs: the analytic cpu tables (--planner.profile none): they cannot price moving "
                 "ranks between training and rollout on shared cores, so the planner keeps the split")
    else:
        log.info("[libra] planner costs: the analytic %s tables (engine.runtime.profile measures CPU runs only; pass "
                 "--planner.profile PATH for a measured one)", cost.hw.name)
    return cost


def _plans_on_this_machine(cfg, kind: str) -> bool:
    """Whether the planner's costs are this machine's cached profile (`cost_model_for`; measured first on a miss)."""
    from scheduler.systems import get_system

    return get_system(cfg.run.system).planner and cfg.planner.profile in ("auto", "refresh") and kind == "cpu"


def warn_host_memory(cost_model, role_map: RoleMap) -> None:
    """Warn when the first layout's ranks need more than the host's memory at their peaks (a measured CPU profile
    knows both): the planner keeps its own moves within it, but step 1 runs the layout it was given."""
    from scheduler.profile import HOST_MEM_FRAC, ProfiledCostModel

    if not isinstance(cost_model, ProfiledCostModel):
        return
    ranks = len(role_map.trainer_ranks), len(role_map.rollout_ranks)
    if not cost_model.host_fits(*ranks):
        need = cost_model.host_need_bytes(*ranks)
        log.warning("[libra] %s: its ranks need ~%.1f GB at their peaks (the profile's measured RSS) of this host's "
                    "%.1f GB, past the %.0f%% the planner keeps within: the run may be killed for memory; pass a "
                    "smaller --nproc", role_map.describe(), need / 1e9, cost_model.profile.host_mem_bytes / 1e9,
                    HOST_MEM_FRAC * 100)


def _analytic_cost_model(model: str, device_kind: str):
    from engine.models import model_spec
    from scheduler.costmodel import HARDWARE, CostModel

    hw = {"cpu": "cpu", "npu": "910b3"}.get(device_kind, "h100")
    return CostModel(HARDWARE[hw], model_spec(model))  # a model outside the tables: its own shape


CPU_RANKS_PER_CORE = 4  # more worker ranks than this per core only time-slice the same cores
RANK_RSS_GB_SMOLLM2 = 0.3  # a SmolLM2 rank's resident set on CPU (64 ranks measured 19.8 GB, issue 33)


def start_ranks_early(cfg) -> None:
    """Start the ranks' forkserver before the launcher plans (`launch.start_forkserver`), unless the run uses
    spawn, runs under torchrun, or first measures this machine's profile (that measurement wants the cores)."""
    if cfg.launch.start_method != "forkserver" or ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        return
    if _plans_on_this_machine(cfg, detect(cfg.run.device).kind):
        from engine.runtime.profile_cache import is_cached

        if cfg.planner.profile == "refresh" or not is_cached(cfg.run.model, "cpu"):
            return
    from engine.runtime.launch import start_forkserver

    start_forkserver()


def plan_placement(cfg) -> tuple[object, DeviceInfo, RoleMap]:
    """(the config with `planner.allowed_tp` resolved to the degrees the model splits at, the device, the
    first role map: a resumed run's from its checkpoint). The ranks get this config and never resolve it again."""
    info = detect(cfg.run.device)
    cfg = dataclasses.replace(cfg, planner=dataclasses.replace(cfg.planner, allowed_tp=valid_tp_degrees(cfg)))
    if cfg.run.resume:
        from engine.runtime.preflight import check_resume

        check_resume(Path(cfg.run.resume))
        return cfg, info, checkpoint.load(checkpoint.latest(Path(cfg.run.resume))).role_map
    nproc = cfg.run.nproc or info.default_nproc()
    if info.kind != "cpu" and nproc > info.count:
        # allowed (e.g. 2 ranks on one GPU to try a node): ranks share devices round-robin, their
        # weight sync goes over gloo, and a trainer or TP group over a shared device is refused (groups.py)
        log.warning("[libra] --nproc %d on %d %s device(s): ranks share devices; the sync among them uses gloo, "
                    "and training and TP instances need one rank per device", nproc, info.count, info.kind)
    if info.kind == "cpu" and nproc > CPU_RANKS_PER_CORE * info.count:
        log.warning("[libra] --nproc %d on %d CPU core(s): %d processes share them (each rank holds its own model, "
                    "~%.1f GB in all for SmolLM2) and every step slows down; the CPU default is %d", nproc, info.count,
                    nproc + 1, (nproc + 1) * RANK_RSS_GB_SMOLLM2, info.default_nproc())
    from scheduler.systems import initial_role_map

    role_map = initial_role_map(cfg.run.system, nproc, buckets=cfg.buckets, trainer_frac=cfg.launch.trainer_frac,
                                allowed_tp=cfg.planner.allowed_tp)
    return cfg, info, role_map


def placement_table(role_map: RoleMap, info: DeviceInfo, cfg) -> str:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{cfg.run.system} on {cfg.run.bench}: {role_map.describe()}")
    for col in ("rank", "role", "bucket", "instance", "TP", "device"):
        table.add_column(col)
    limits = {b.name: b.max_tokens for b in role_map.buckets}
    for r in range(role_map.world_size):
        inst = role_map.instance_of(r)
        roles = " + ".join(role_map.roles_of(r))
        bucket = f"{inst.bucket} (<= {limits[inst.bucket]} tok)" if inst and limits[inst.bucket] else (inst.bucket if inst else "-")
        table.add_row(str(r), roles, bucket, str(inst.instance_id) if inst else "-", str(inst.tp) if inst else "-",
                      str(rank_device(info, r + 1, r + 1)))
    console = Console(record=True, width=110)
    with console.capture() as cap:
        console.print(table)
    return cap.get() + "coordinator: an extra CPU process (global rank 0); worker rank r is global rank r + 1\n"


@dataclass
class CoordinatorParts:
    env: object
    tasks: list
    tokenizer: object
    router: object
    planner: object
    spec: object
    design: object = None  # libra's first design (`first_design`); None: the system's own pipeline


def make_run_env(cfg):
    """The run's env: the bench's, or `--env`, scored by `--reward` when given (envs/plugins.py)."""
    from engine.runtime.preflight import run_env_kwargs
    from envs.plugins import make_run_env as make

    return make(cfg.run.bench, env_spec=cfg.run.env, reward_spec=cfg.run.reward, **run_env_kwargs(cfg))


def run_tasks(cfg, env) -> list:
    """The run's tasks as rank 0 poses them: the env's, with the demonstration turns `--demo-turns` asks for."""
    from envs.demo import add_demo_turns
    from envs.registry import scripted_agents

    tasks = env.tasks()
    if not tasks:
        raise ValueError(f"--bench {cfg.run.bench} with level={cfg.run.level} gave no tasks; pick another level")
    if cfg.run.demo_turns > 0:  # a custom env has no scripted oracle: its tasks bring their demonstrations
        tasks = add_demo_turns(tasks, cfg.run.demo_turns, None if cfg.run.env else scripted_agents(cfg.run.bench)[0])
    return tasks


PRIOR_TASKS = 32  # task prompts the first design's length prior is tokenized from


def first_design(cfg, cost_model, role_map: RoleMap):
    """Libra's design before step 1 (scheduler/design.py), ranked on its tasks' prompts at the run's generation
    caps (`cap_prior`), so that a run whose caps bound its lengths starts where its first check would move it.
    None where the run starts on the launcher's split: another system, `--planner.first-design split`, a
    resumed run (its checkpoint's layout), or a cost model that cannot price a split."""
    from engine.chat import render_prompt
    from engine.models import load_tokenizer
    from scheduler.design import cap_prior, design_space, rank_designs
    from scheduler.systems import get_system

    if (not get_system(cfg.run.system).chooses_design or cfg.planner.first_design != "prior" or cfg.run.resume
            or not cost_model.prices_split):
        return None
    env = make_run_env(cfg)
    try:
        tasks = run_tasks(cfg, env)[:PRIOR_TASKS]
    finally:
        env.close()
    tokenizer = load_tokenizer(cfg.run.model)
    prompts = [len(render_prompt(tokenizer, list(t.messages), list(t.tools))) for t in tasks]
    r, step = cfg.rollout, cfg.step
    prior = cap_prior(prompts, max_turns=r.max_turns, max_new_tokens_per_turn=r.max_new_tokens_per_turn,
                      max_tool_tokens=r.max_tool_tokens, max_total_tokens=r.max_total_tokens,
                      trajectories_per_step=step.prompts_per_step * step.samples_per_prompt)
    space = design_space(world_size=role_map.world_size, buckets=cfg.buckets.buckets(), planner=cfg.planner,
                         max_staleness=step.max_staleness, group_size=step.samples_per_prompt)
    ranked = rank_designs(cost_model, space, prior, cfg.run.steps)
    log.info("[libra] first design: %s, ranked on %d task prompts at the generation caps (%.0f tokens a trajectory): "
             "%.1f s a step predicted; --planner.first-design split starts on the launcher's split",
             ranked[0].label, len(prompts), prior.train_tokens / prior.num_trajectories, ranked[0].step_s)
    return ranked[0]


def build_parts(cfg, role_map: RoleMap, cost_model, resume: RunState | None, design=None) -> CoordinatorParts:
    """Rank 0's parts; `cfg` (its allowed TP degrees), `cost_model` and libra's first `design` are what the
    launcher resolved."""
    from engine.models import load_tokenizer
    from scheduler.systems import get_system, make_planner, make_router

    env = make_run_env(cfg)
    tasks = run_tasks(cfg, env)
    router = make_router(cfg.run.system, cfg.router)
    if resume and resume.prefix_tree:
        router.load_tree_json(resume.prefix_tree)
    remaining = cfg.run.steps - (resume.step if resume else 0)
    planner = make_planner(cfg.run.system, role_map.world_size, cost_model, remaining, cfg.planner,
                           current=role_map, buckets=cfg.buckets, max_staleness=cfg.step.max_staleness,
                           group_size=cfg.step.samples_per_prompt, design=design)
    return CoordinatorParts(env, tasks, load_tokenizer(cfg.run.model), router, planner,
                            get_system(cfg.run.system), design)


def rank_main(ctx: RankContext, cfg, role_map: RoleMap, out_dir: str, resume: RunState | None, handoff: str | None,
              cost_model=None, design=None):
    """Every process of the job: rank 0 coordinates, the others work; `handoff`: the checkpoint to resume from;
    `cost_model` and libra's first `design` (None: the system's own pipeline): the launcher's (rank 0 uses them)."""
    if ctx.rank == 0:
        from engine.runtime.coordinator import Coordinator

        ctx.set_role("coordinator")
        assert cost_model is not None, "rank 0 needs the cost model the launcher resolved (run() passes it)"
        parts = build_parts(cfg, role_map, cost_model, resume, design)
        try:
            return Coordinator(ctx, cfg, role_map, Path(out_dir), parts, resume).run(handoff)
        finally:
            parts.env.close()
    from engine.runtime.worker import worker_main

    return worker_main(ctx, cfg, role_map, handoff, out_dir)


def run(cfg, info: DeviceInfo, role_map: RoleMap, out_dir: Path) -> int:
    resume, handoff = None, None
    if cfg.run.resume:
        ckpt = checkpoint.latest(out_dir)
        resume, handoff = checkpoint.load(ckpt), str(ckpt)
        log.info("[libra] resuming %s from step %d (policy v%d)", out_dir, resume.step, resume.policy_version)
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if torchrun and int(os.environ["WORLD_SIZE"]) != role_map.world_size + 1:
        raise ValueError(f"torchrun started {os.environ['WORLD_SIZE']} processes but the placement has "
                         f"{role_map.world_size} workers + 1 coordinator; pass --nproc {int(os.environ['WORLD_SIZE']) - 1}")
    if not torchrun or int(os.environ["RANK"]) == 0:  # under torchrun every process runs this: rank 0 writes
        out_dir.mkdir(parents=True, exist_ok=True)
        cfg.write(out_dir / ("config.json" if not resume else f"config.resume-{resume.step}.json"))
        cost_model = cost_model_for(cfg, info)  # a profile this machine lacks is measured before any rank starts
        design = first_design(cfg, cost_model, role_map)
        role_map = design.role_map if design is not None else role_map
        log.info("[libra] run dir %s | %d workers + coordinator on %s | %s", out_dir, role_map.world_size, info.kind,
                 role_map.describe())
        warn_host_memory(cost_model, role_map)
    else:  # a torchrun worker: rank 0's process resolved the cost model; the first design every process
        from scheduler.systems import get_system

        cost_model, design = None, None  # places its ranks on is the same decision, made again quietly
        if get_system(cfg.run.system).chooses_design and not resume:
            logging.disable(logging.INFO)  # rank 0 said it all (a profile miss measures once: the cache's lock)
            try:
                design = first_design(cfg, cost_model_for(cfg, info), role_map)
            finally:
                logging.disable(logging.NOTSET)
            role_map = design.role_map if design is not None else role_map
    args = (cfg, role_map, str(out_dir), resume, handoff, cost_model, design)
    if torchrun:
        results = run_in_torchrun(rank_main, args, device_info=info, threads_per_rank=cfg.launch.threads_per_rank,
                                  timeout_s=cfg.launch.timeout_s)
        if results is None:  # not rank 0: the coordinator writes the summary
            return 0
        _write_summary(results, out_dir)
        stopped = results[0].get("stopped_by")  # torchrun's agent forwarded a stop signal
        return 128 + signal.Signals[stopped] if stopped else 0
    try:
        results = spawn(rank_main, role_map.world_size + 1, args, device_info=info,
                        threads_per_rank=cfg.launch.threads_per_rank, start_method=cfg.launch.start_method,
                        timeout_s=cfg.launch.timeout_s, stop_grace_s=cfg.launch.stop_grace_s)
    except WorkerFailed as exc:
        log.error("[libra] %s", exc)
        return 1
    except KeyboardInterrupt as stop:  # the ranks finished the stop in time: the run's outputs are whole
        if getattr(stop, "results", None):
            _write_summary(stop.results, out_dir)
        raise
    _write_summary(results, out_dir)
    return 0


def _write_summary(results: list, out_dir: Path) -> None:
    """summary.json from the coordinator's summary and every worker's result; printed, and, for a stopped
    run, how to resume it."""
    summary = results[0]
    ranks = results[1:]
    summary["peak_rss_mb"] = max([r["peak_rss_mb"] for r in ranks] + [0.0])
    summary["peak_rss_mb_total"] = sum(r["peak_rss_mb"] for r in ranks) + peak_memory_mb().host_mb
    summary["peak_rss_mb_per_rank"] = [round(r["peak_rss_mb"], 1) for r in ranks]
    RunWriter(out_dir).summary(summary)
    rows = read_metrics(out_dir) if (out_dir / "metrics.jsonl").is_file() else []
    print_summary(summary, out_dir)
    if rows:
        plot_run(out_dir, rows)
        print("\n".join(run_story(summary, rows, out_dir)))
    if summary.get("stopped_by"):
        ckpt = checkpoint.latest(out_dir)
        log.warning("[libra] stopped by %s after step %d; checkpoint %s; continue with: python libra.py --resume %s",
                    summary["stopped_by"], summary["steps"], ckpt, out_dir)


def run_compare(cfg, info: DeviceInfo, out_dir: Path) -> int:
    """Every system on the same tasks and seed, one after the other; compare.json + compare.png.

    Shares the table, ratios and plot with the simulator's compare (`runlog.py`), so a real and a
    simulated comparison read the same way.
    """
    from config import for_system
    from runlog import add_ratios, format_table, plot_compare
    from scheduler.systems import SYSTEMS

    names = list(cfg.run.compare_systems) or [n for n, spec in SYSTEMS.items() if not spec.sim_only]
    results = {}
    for name in names:
        sub, _, role_map = plan_placement(for_system(cfg, name))
        rc = run(sub, info, role_map, out_dir / name)
        if rc != 0:
            raise RuntimeError(f"--compare: system {name} failed (exit {rc}); its logs and outputs are in {out_dir / name}")
        results[name] = json.loads((out_dir / name / "summary.json").read_text())
    best = max(s["reward_last"] or 0.0 for s in results.values())
    target = best / 2 if best > 0 else None
    for s in results.values():
        s["reward_target"] = target
        s["time_to_target_s"] = next((t for t, r in s["reward_curve"] if target is not None and r >= target), None)
    compare = {"bench": cfg.run.bench, "mode": "real", "systems": results,
               "setup": f"model={cfg.run.model} workers={role_map.world_size} steps={cfg.run.steps} seed={cfg.run.seed}",
               "note": "measured on this machine; reward target = half the best final reward of the compared systems"}
    add_ratios(compare["systems"])
    (out_dir / "compare.json").write_text(json.dumps(compare, indent=2))
    plot_compare(compare, out_dir / "compare.png")
    print(format_table(compare))
    print(f"wrote {out_dir / 'compare.json'} and {out_dir / 'compare.png'}")
    return 0


def print_summary(s: dict, out_dir: Path) -> None:
    print(f"\n== libra summary ({s['system']} on {s['bench']}, {s['mode']}, model {s.get('model', '?')}) ==")
    print(f"steps {s['steps']}  wall {s['wall_s']:.1f} s  tokens/s {s['tokens_per_s']:.1f}  trajectories/s {s['trajectories_per_s']:.3f}")
    print(f"reward first {s['reward_first']}  last {s['reward_last']}  migrations {s['migrations']}  "
          f"role-map changes {s.get('role_map_changes', 0)}")
    print(f"trajectories: {s['ledger']}  peak RSS per rank {s['peak_rss_mb']:.0f} MB, whole run {s['peak_rss_mb_total']:.0f} MB")
    print(f"layout first {s['role_map_first']}  last {s['role_map_last']}")
    print(f"outputs: {out_dir}/ (summary.json, metrics.jsonl, plot.png, trajectories_sample.jsonl, trace.json)")
