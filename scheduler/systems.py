"""The systems Libra is compared against, as one table, and factories for their parts.

`SYSTEMS` maps each `--system` name of docs/design.md to a frozen `SystemSpec`: which router it uses,
whether its rollout buckets are heterogeneous, whether a planner re-plans, whether ranks move
between training and rollout, whether rollout and training overlap, whether it is colocated,
whether idle rollout instances help train (`elastic`: the libra variants with a planner, which
decides; `libra-no-elastic` is libra without it).
The runtime and the simulator build a system's router, first role map and planner from here
and nowhere else, so a system means the same thing in both.

Initial layouts (`initial_role_map`), for world_size G >= 2 and trainer share f:
- colocate, libra-hybrid: every rank trains and generates (`colocated_role_map`); colocate
  alternates the two, libra-hybrid overlaps them by time-sharing (`lookahead_of`).
- homogeneous systems: round(G f) trainer ranks (at least 1, leaving at least 1), the rest TP-m
  instances of one unbounded bucket, m the model's minimum TP (1 without a cost model).
- heterogeneous systems: the same split; rollout ranks R get one "long" instance of the largest
  TP in {2, 4, 8} not above max(2, R/2) when R >= 3, a TP2 "medium" instance when at least 4
  ranks remain, and TP1 "short" instances for the rest (R = 2: short TP1 + long TP1; R = 1: one
  TP1 instance in the shortest bucket, which the routers then use for every bucket).

Invariants (tests/scheduler/test_scheduler_systems.py): every name of docs/design.md is present; every initial
role map validates for G in 2..1024; heterogeneous systems get a TP >= 2 instance once R >= 3;
`make_planner` returns None exactly for the systems without a planner, and libra's is the design
planner where the cost model prices a split; only a system with a planner is elastic.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from scheduler.api import Router
from scheduler.cmlfq import CMLFQRouter
from scheduler.costmodel import CostModel
from scheduler.design import MEASURED_LAG_GAMMA, Design, design_space
from scheduler.design_planner import DesignPlanner
from scheduler.layout import VALID_TP, Bucket, BucketsConfig, RoleMap, colocated_role_map, split_role_map
from scheduler.planner import GlobalPlanner, PlannerConfig
from scheduler.routers import LAMLFQRouter, LeastLoadRouter, LengthAwareRouter, RouterConfig

ROUTERS = {"cmlfq": CMLFQRouter, "least_load": LeastLoadRouter, "length_aware": LengthAwareRouter,
           "la_mlfq": LAMLFQRouter}
SIM_ROUTERS = ("oracle",)  # built by the simulator itself (sim/oracle.py: it needs every true length)


@dataclass(frozen=True, kw_only=True)
class SystemSpec:
    name: str  # the --system name
    router: str  # key of ROUTERS
    heterogeneous: bool  # rollout buckets of different TP degree (else one bucket, one TP)
    planner: bool  # a GlobalPlanner re-plans the layout during the run
    realloc: bool  # ranks may move between training and rollout
    async_pipeline: bool  # rollout of step n+1 overlaps training of step n
    colocated: bool  # every rank generates, then trains (verl style)
    batch_by_finish: bool = False  # a batch is the first complete groups to finish, from any admitted step
    interrupt_on_update: bool = False  # a weight update interrupts in-flight generation: KV recomputed on the new weights
    off_policy: str = "decoupled"  # the trainer's objective for stale tokens that its users run (TrainerConfig.off_policy)
    sim_only: bool = False  # needs knowledge only the simulator has
    chooses_design: bool = False  # the planner picks the design (scheduler/design.py) before step 1, from the bench's prior
    elastic: bool = False  # idle TP1 rollout instances help train a batch where the planner says it pays (scheduler/elastic.py)
    description: str = ""  # one line for tables and --help

    def __post_init__(self) -> None:
        if self.router not in ROUTERS and not (self.sim_only and self.router in SIM_ROUTERS):
            raise ValueError(f"SystemSpec {self.name!r}: router={self.router!r} is not one of {sorted(ROUTERS)}")
        if self.realloc and not self.planner:
            raise ValueError(f"SystemSpec {self.name!r}: realloc=True needs planner=True; the planner decides the moves")
        if self.elastic and not self.planner:
            raise ValueError(f"SystemSpec {self.name!r}: elastic=True needs planner=True; the planner decides who helps train")


def _spec(name: str, router: str, het: bool, planner: bool, realloc: bool, desc: str, **kw) -> SystemSpec:
    return SystemSpec(name=name, router=router, heterogeneous=het, planner=planner, realloc=realloc,
                      async_pipeline=kw.pop("async_pipeline", True), colocated=kw.pop("colocated", False),
                      description=desc, **kw)


SYSTEMS: dict[str, SystemSpec] = {s.name: s for s in (
    _spec("libra", "cmlfq", True, True, True, "the design first to the reward target (scheduler/design.py: split with C-MLFQ, "
          "finish-order batches, colocated or time-shared hybrid, and its lag bound), then C-MLFQ + planner + rank "
          "reassignment within it; idle rollout instances help train", chooses_design=True, elastic=True),
    _spec("colocate", "least_load", False, False, False,
          "verl-style synchronous: every rank generates, then every rank trains", async_pipeline=False, colocated=True),
    _spec("static", "least_load", False, False, False, "fixed split, homogeneous TP, least-load routing, one-step off-policy"),
    _spec("verl-async", "least_load", False, False, False,
          "verl's one-step-off async: static's parts (fixed split, one TP, least-load), compared at its best TP and split; "
          "stale tokens clipped against their rollout log-probs (verl's bypass mode)", off_policy="bypass"),
    _spec("fully-async", "least_load", False, False, False,
          "AReaL-style: continuous rollout, batches of the first groups to finish, bounded staleness, partial rollout "
          "interrupted at each weight update (its KV recomputed on the new weights)", batch_by_finish=True,
          interrupt_on_update=True),
    _spec("partial-rollout", "least_load", False, False, False,
          "slime/APRIL-style: batches of the first groups to finish, unfinished ones carried on with the new weights, "
          "their KV kept", batch_by_finish=True),
    _spec("length_aware", "length_aware", True, False, False, "fixed split, heterogeneous buckets, per-prompt length predictor"),
    _spec("la_mlfq", "la_mlfq", True, False, False, "fixed split, heterogeneous buckets, MLFQ demotion by token limits"),
    _spec("oracle", "oracle", True, True, True, "clairvoyant routing by true length + planner: the bound of step-batched schedules",
          sim_only=True, elastic=True),
    _spec("libra-partial", "cmlfq", True, True, True,
          "libra whose batches are the first groups to finish (partial-rollout's batching): the tail leaves the step",
          batch_by_finish=True, elastic=True),
    _spec("libra-hybrid", "least_load", False, False, False,
          "libra's time-shared hybrid layout: every rank hosts a rollout instance and trains; while a batch's tail "
          "finishes, the free instances start the next step's trajectories (one step of lookahead); all pause to "
          "train and resume on the new weights (one of the designs libra's planner chooses among)", colocated=True),
    _spec("libra-no-design", "cmlfq", True, True, True,
          "libra held to its split design (step batches, the configured lag bound), whatever the bench's prior says",
          elastic=True),
    _spec("libra-no-planner", "cmlfq", True, False, False, "libra with its initial layout kept for the whole run"),
    _spec("libra-no-realloc", "cmlfq", True, True, False, "libra whose planner re-plans buckets but keeps the train/rollout split",
          elastic=True),
    _spec("libra-no-cmlfq", "least_load", True, True, True, "libra with least-load routing instead of C-MLFQ", elastic=True),
    _spec("libra-homogeneous", "cmlfq", False, True, True, "libra with one bucket of one TP degree", elastic=True),
    _spec("libra-no-elastic", "cmlfq", True, True, True, "libra whose idle rollout instances never help train (its design "
          "chosen as libra's)", chooses_design=True),
)}


def get_system(name: str) -> SystemSpec:
    if name not in SYSTEMS:
        raise ValueError(f"unknown system {name!r}; choose one of {list(SYSTEMS)}")
    return SYSTEMS[name]


def make_router(system: str, cfg: RouterConfig | None = None) -> Router:
    spec = get_system(system)
    if spec.router not in ROUTERS:
        raise ValueError(f"system {system!r} is simulator-only: its {spec.router} router needs every trajectory's "
                         "true length; run it with --sim")
    return ROUTERS[spec.router](cfg)


def _split(world_size: int, trainer_frac: float) -> int:
    if world_size < 2:
        raise ValueError(f"initial_role_map: world_size={world_size} must be >= 2 (one trainer + one rollout rank)")
    if not 0 < trainer_frac < 1:
        raise ValueError(f"initial_role_map: trainer_frac={trainer_frac} must be in (0, 1), e.g. 0.5")
    return min(world_size - 1, max(1, round(world_size * trainer_frac)))


def _heterogeneous_tp(num_rollout: int, buckets: tuple[Bucket, ...], min_tp: int,
                      allowed_tp: tuple[int, ...] = VALID_TP) -> tuple[tuple[str, int], ...]:
    short, long_ = buckets[0].name, buckets[-1].name
    medium = buckets[len(buckets) // 2].name if len(buckets) >= 3 else long_
    r = num_rollout
    if min_tp > 1 or r < 2:
        return tuple((short, min_tp) for _ in range(r // min_tp))
    multi = [t for t in VALID_TP if t > 1 and t in allowed_tp and t <= r]
    if r == 2 or not multi:
        # no TP split possible (or no room for one): heterogeneity by bucket only, TP1 everywhere
        return tuple([(short, 1)] * (r - 1) + [(long_, 1)])
    long_tp = max([t for t in multi if t <= max(2, r // 2)] or [min(multi)])
    spec, left = [(long_, long_tp)], r - long_tp
    if left >= 4 and 2 in allowed_tp:
        spec.append((medium, 2))
        left -= 2
    return tuple([(short, 1)] * left + spec)


def initial_role_map(system: str, world_size: int, *, cost_model: CostModel | None = None,
                     buckets: BucketsConfig | None = None, trainer_frac: float = 0.5,
                     allowed_tp: tuple[int, ...] = VALID_TP) -> RoleMap:
    """A sane first layout for `system` on `world_size` ranks (see the module docstring)."""
    spec = get_system(system)
    min_tp = cost_model.min_rollout_tp() if cost_model else 1
    if cost_model:  # e.g. SmolLM2-135M has 9 heads: only TP1 can hold it
        allowed_tp = tuple(t for t in allowed_tp if cost_model.model.tp_divides(t)) or (1,)
    if spec.colocated:
        return colocated_role_map(world_size=world_size, tp=min_tp if world_size % min_tp == 0 else 1)
    num_trainer = _split(world_size, trainer_frac)
    r = world_size - num_trainer
    if r < min_tp:
        raise ValueError(f"initial_role_map: {r} rollout ranks cannot hold the model (TP >= {min_tp}); "
                         f"lower trainer_frac={trainer_frac} or add ranks")
    buckets = buckets or BucketsConfig()
    if spec.heterogeneous:
        layout_buckets = buckets.buckets()
        rollout = _heterogeneous_tp(r, layout_buckets, min_tp, allowed_tp)
    else:
        layout_buckets = buckets.single()
        rollout = tuple((layout_buckets[0].name, min_tp) for _ in range(r // min_tp))
    # Ranks a TP group cannot use go to the trainer rather than idle.
    num_trainer = world_size - sum(tp for _, tp in rollout)
    return split_role_map(world_size=world_size, num_trainer=num_trainer, rollout_tp=rollout, buckets=layout_buckets)


def lookahead_of(system: str, max_staleness: int, *, colocated: bool | None = None) -> int:
    """Steps the step core admits ahead of the trainer: `max_staleness` when rollout overlaps training,
    i.e. the system's pipeline is async and its layout does not put every rank in both roles; else 0.

    The one definition: the coordinator, the planner's step model, the simulator and the tuned
    baselines all ask here. `colocated`: whether the layout actually run is colocated, when it is
    not the system's own (a layout held fixed); None: the system's own."""
    spec = get_system(system)
    colocated = spec.colocated if colocated is None else colocated
    hybrid = spec.colocated and spec.async_pipeline  # time-shared: generation pauses while the same ranks train
    return max_staleness if spec.async_pipeline and (hybrid or not colocated) else 0


def make_planner(system: str, world_size: int, cost_model: CostModel, remaining_steps: int,
                 cfg: PlannerConfig | None = None, current: RoleMap | None = None,
                 buckets: BucketsConfig | None = None, max_staleness: int = 1, *, group_size: int = 8,
                 design: Design | None = None, gamma: float = MEASURED_LAG_GAMMA, within_design: bool = False,
                 lookahead: int | None = None):
    """The system's planner (None when it has none), its flags forced from the system spec and its
    step model told how far the pipeline runs ahead (`lookahead`: the steps the core admits ahead of the
    trainer; None: `lookahead_of`, which a design overrides: a finish-order design runs its lag ahead and
    bounds the trained lag above it).

    For a system that chooses its design (libra) on a cost model that can price a split: the
    `DesignPlanner` over the design in force (`design`, the one chosen on the bench's prior; None:
    the split of `current` at lag `max_staleness`), its lag bounded by `max_staleness` and priced
    at `gamma` per version, whose planner within a split design is the `GlobalPlanner`
    (`within_design`: that one)."""
    spec = get_system(system)
    if not spec.planner:
        return None
    cfg = cfg or PlannerConfig()
    if spec.chooses_design and cost_model.prices_split and current is not None and not within_design:
        buckets = buckets or BucketsConfig()
        space = design_space(world_size=world_size, buckets=buckets.buckets(), planner=cfg, max_staleness=max_staleness,
                             group_size=group_size, gamma=gamma)
        # a colocated layout in force (a resumed run that had moved to one) runs time-shared at this lookahead
        # libra's designs run as its SYSTEMS entries (DESIGN_FAMILIES), whichever libra variant chooses among them
        design = design or Design(system="libra-hybrid" if current.colocated else "libra", lag=max_staleness,
                                  role_map=current, step_s=math.nan, fill_s=math.nan, gamma=space.gamma)

        def planner_for(d: Design, remaining: int):
            return make_planner(d.system, world_size, cost_model, remaining, cfg, current=d.role_map, buckets=buckets,
                                max_staleness=d.max_staleness, within_design=True, lookahead=d.lookahead)
        return DesignPlanner(cost_model, space, design, remaining_steps, cfg=cfg, planner_for=planner_for,
                             lookahead=design.lookahead)
    cfg = dataclasses.replace(cfg, heterogeneous=spec.heterogeneous, allow_realloc=spec.realloc)
    return GlobalPlanner(cfg, cost_model, world_size, remaining_steps, current=current, buckets=buckets,
                         lookahead=lookahead_of(system, max_staleness) if lookahead is None else lookahead)
