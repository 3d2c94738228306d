"""Request routers over a rollout layout: shared bookkeeping plus the baseline policies.

Every router implements the `Router` protocol of `scheduler/api.py`. `BaseRouter` does what they
all share:

1. `set_layout` indexes the role map: the *active* buckets are those with at least one instance;
   a bucket's effective limit is its `max_tokens`, except that the longest active bucket is
   unbounded (it takes whatever outgrows the others). Requests whose instance vanished are
   re-homed (same bucket if it still has instances, else the bucket that fits their tokens).
2. Load is tokens in flight per instance (prompt + generated so far), updated on every event,
   so "least loaded" means least KV/decode work, not fewest requests. Ties go to the lower
   instance id, which keeps routing deterministic.
3. The router remembers each request's outcomes and the tokens at each, so `on_finish` can
   hand a complete `TrajectoryRecord` to whoever learns from it (C-MLFQ's prefix tree).
4. What a router learned that outlives a run (`tree_json` / `load_tree_json`, for checkpoints
   and warm starts): nothing here (None, and a warm start is ignored); C-MLFQ overrides both.

Policies here (C-MLFQ is in `scheduler/cmlfq.py`):
- `LeastLoadRouter` (`least_load`): least-loaded instance over all instances, never migrates.
- `LengthAwareRouter` (`length_aware`): predicts a prompt's length as the mean of its last
  finished trajectories and routes once, at admission, to the bucket that fits; never migrates.
- `LAMLFQRouter` (`la_mlfq`): starts in the shortest bucket and is demoted when its tokens
  outgrow the bucket's limit (token thresholds only, no causal signal).

Invariants (tests/scheduler/test_scheduler_routers.py): a route or decision only names an instance of the
current layout and that instance's bucket; a migration only goes to a strictly longer bucket;
every admitted request stays tracked until finish/cancel, including across `set_layout`; the
same event sequence gives the same decisions.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from scheduler.api import Decision, OutcomeState, Route
from scheduler.layout import RoleMap
from scheduler.prefix_tree import PrefixTreeConfig, TrajectoryRecord

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class RouterConfig:
    tree: PrefixTreeConfig = field(default_factory=PrefixTreeConfig)  # C-MLFQ prefix tree settings
    demote: bool = True  # C-MLFQ: also demote on token limits at decode boundaries (safety net)
    length_history: int = 8  # length_aware: finished trajectories remembered per prompt
    migrate_load_slack: float = 2.0  # C-MLFQ: per-device load ratio that spills admissions / holds causal moves

    def __post_init__(self) -> None:
        if self.length_history < 1:
            raise ValueError(f"RouterConfig: length_history={self.length_history} must be >= 1")
        if not self.migrate_load_slack > 0:
            raise ValueError(f"RouterConfig: migrate_load_slack={self.migrate_load_slack} must be > 0; "
                             "use a large value (e.g. 1e9) to migrate whatever the load")


def cpu_router_config(**overrides) -> RouterConfig:
    """A prefix tree sized for CPU runs: a few hundred trajectories, rebuilt every 4 finishes.

    A CPU step finishes 4 trajectories: rebuilt every 16, the tree of a 3-step run was never built
    and C-MLFQ never moved a request (a rebuild over a few hundred records costs well under 1 ms)."""
    base = dict(tree=PrefixTreeConfig(window=500, rebuild_every=4))
    base.update(overrides)
    return RouterConfig(**base)


class RouterRequest:
    """What a router tracks of one request (shared by every router built on BaseRouter)."""

    __slots__ = ("request_id", "prompt_id", "prompt_tokens", "instance_id", "bucket", "tokens",
                 "outcomes", "tokens_at", "cursor", "num_migrations")

    def __init__(self, request_id: str, prompt_id: str, prompt_tokens: int) -> None:
        self.request_id, self.prompt_id, self.prompt_tokens = request_id, prompt_id, prompt_tokens
        self.instance_id, self.bucket, self.tokens = -1, -1, prompt_tokens
        self.outcomes: list[OutcomeState] = []
        self.tokens_at: list[int] = []
        self.cursor = None
        self.num_migrations = 0


class BaseRouter:
    """Bookkeeping shared by all routers; subclasses override the `_admit_bucket`/`_on_*` hooks."""

    name = "base"

    def __init__(self, cfg: RouterConfig | None = None) -> None:
        self.cfg = cfg or RouterConfig()
        self.role_map: RoleMap | None = None
        self._reqs: dict[str, RouterRequest] = {}
        self._load: dict[int, int] = {}
        self._by_bucket: dict[int, list[int]] = {}
        self._inst_bucket: dict[int, int] = {}
        self._active: list[int] = []
        self._limit: dict[int, int | None] = {}
        self._stays: dict[tuple[int, int], Decision] = {}  # (instance, bucket) -> "stay" there, in this layout
        self.num_migrations = 0
        self.num_demotions = 0

    # ---- layout --------------------------------------------------------------------------
    def set_layout(self, role_map: RoleMap, now: float) -> dict[str, Route]:
        names = [b.name for b in role_map.buckets]
        old_names = [b.name for b in self.role_map.buckets] if self.role_map else names
        self.role_map = role_map
        self._by_bucket = {}
        self._inst_bucket = {}
        for inst in role_map.instances:
            bi = names.index(inst.bucket)
            self._by_bucket.setdefault(bi, []).append(inst.instance_id)
            self._inst_bucket[inst.instance_id] = bi
        for ids in self._by_bucket.values():
            ids.sort()  # by id: the first least-loaded one is the lowest id (`_pick`)
        self._stays = {}
        self._active = sorted(self._by_bucket)
        self._limit = {bi: role_map.buckets[bi].max_tokens for bi in self._active}
        self._limit[self._active[-1]] = None
        self._load = {iid: 0 for iid in sorted(self._inst_bucket)}  # by id, as `_pick` scans it
        moved: dict[str, Route] = {}
        for req in self._reqs.values():
            self._rehome(req, old_names, names, moved)
            self._load[req.instance_id] += req.tokens
        return moved

    def _rehome(self, req: RouterRequest, old_names: list[str], names: list[str], moved: dict[str, Route]) -> None:
        if req.instance_id in self._inst_bucket:
            req.bucket = self._inst_bucket[req.instance_id]
            return
        old = old_names[req.bucket] if 0 <= req.bucket < len(old_names) else None
        bi = names.index(old) if old in names else -1
        if bi not in self._by_bucket:
            bi = self._bucket_for_tokens(req.tokens)
        req.bucket, req.instance_id = bi, self._pick(bi)
        moved[req.request_id] = Route(req.instance_id, names[bi])

    # ---- helpers -------------------------------------------------------------------------
    def _pick(self, bucket: int) -> int:
        """The least-loaded instance of `bucket`, ties to the lowest id (min keeps the first of equals)."""
        return min(self._by_bucket[bucket], key=self._load.__getitem__)

    def _bucket_for_tokens(self, tokens: float) -> int:
        for bi in self._active:
            lim = self._limit[bi]
            if lim is None or tokens <= lim:
                return bi
        return self._active[-1]

    def _route(self, req: RouterRequest) -> Route:
        return Route(req.instance_id, self.role_map.buckets[req.bucket].name)

    def _stay(self, req: RouterRequest, reason: str = "") -> Decision:
        if reason:
            return Decision("stay", req.instance_id, self.role_map.buckets[req.bucket].name, reason)
        key = (req.instance_id, req.bucket)  # a Decision is frozen: one per seat serves every request there
        stay = self._stays.get(key)
        if stay is None:
            stay = self._stays[key] = Decision("stay", req.instance_id, self.role_map.buckets[req.bucket].name)
        return stay

    def _migrate(self, req: RouterRequest, bucket: int, reason: str) -> Decision:
        assert bucket > req.bucket, "migrations only go to longer buckets"
        self._load[req.instance_id] -= req.tokens
        req.bucket, req.instance_id = bucket, self._pick(bucket)
        self._load[req.instance_id] += req.tokens
        req.num_migrations += 1
        self.num_migrations += 1
        return Decision("migrate", req.instance_id, self.role_map.buckets[bucket].name, reason)

    def _get(self, request_id: str) -> RouterRequest:
        req = self._reqs.get(request_id)
        if req is None:
            raise KeyError(f"{self.name} router: request {request_id!r} is not in flight (never admitted, or finished)")
        return req

    def _set_tokens(self, req: RouterRequest, tokens: int) -> None:
        self._load[req.instance_id] += tokens - req.tokens
        req.tokens = tokens

    def _demotion(self, req: RouterRequest) -> Decision | None:
        lim = self._limit[req.bucket]
        if lim is None or req.tokens <= lim:
            return None
        # Departure from textbook MLFQ: jump straight to the bucket that fits, since each hop costs a re-prefill.
        target = self._bucket_for_tokens(req.tokens)
        if self._hold_demotion(req, target):
            return None
        self.num_demotions += 1
        return self._migrate(req, target, f"demote tokens={req.tokens}>{lim}")

    def _hold_demotion(self, req: RouterRequest, target: int) -> bool:
        """Whether an over-limit request stays where it is for now (never, in plain MLFQ)."""
        return False

    # ---- protocol --------------------------------------------------------------------------
    def admit(self, request_id: str, prompt_id: str, prompt_tokens: int, now: float) -> Route:
        if self.role_map is None:
            raise RuntimeError(f"{self.name} router: admit({request_id!r}) before set_layout; give it a role map first")
        if request_id in self._reqs:
            logger.debug("request %s admitted again while in flight; replacing it", request_id)
            self.on_cancel(request_id, now)
        req = RouterRequest(request_id, prompt_id, int(prompt_tokens))
        bi, iid = self._admit_target(req)
        req.bucket, req.instance_id = bi, iid
        self._load[iid] += req.tokens
        self._reqs[request_id] = req
        self._on_admit(req)
        return self._route(req)

    def on_tool_return(self, request_id: str, outcome: OutcomeState, tokens_so_far: int, now: float) -> Decision:
        req = self._reqs.get(request_id) or self._get(request_id)
        self._load[req.instance_id] += tokens_so_far - req.tokens  # `_set_tokens`, inline: once per tool return
        req.tokens = tokens_so_far
        req.outcomes.append(outcome)
        req.tokens_at.append(tokens_so_far)
        return self._on_tool(req, outcome)

    def on_decode(self, request_id: str, tokens_so_far: int, now: float) -> Decision:
        req = self._reqs.get(request_id) or self._get(request_id)
        self._set_tokens(req, tokens_so_far)
        return self._on_decode(req)

    def on_finish(self, request_id: str, total_tokens: int, now: float) -> None:
        req = self._get(request_id)
        self._drop(req)
        self._on_finish(req, int(total_tokens))

    def on_cancel(self, request_id: str, now: float) -> None:
        req = self._reqs.get(request_id)
        if req is not None:  # cancel is idempotent: the coordinator may cancel after a finish raced it
            self._drop(req)

    def _drop(self, req: RouterRequest) -> None:
        self._load[req.instance_id] -= req.tokens
        del self._reqs[req.request_id]

    def record_of(self, req: RouterRequest, total_tokens: int) -> TrajectoryRecord:
        return TrajectoryRecord(prompt_id=req.prompt_id, prompt_tokens=req.prompt_tokens, outcomes=tuple(req.outcomes),
                                tokens_at=tuple(req.tokens_at), total_tokens=total_tokens)

    # ---- learned state (checkpoints, warm starts) --------------------------------------------
    def tree_json(self) -> str | None:
        """What this router learned, as JSON for a checkpoint; None: nothing (these routers keep no tree)."""
        return None

    def load_tree_json(self, text: str) -> None:
        """Warm start from an earlier run's `tree_json`; a router without a tree has nothing to load."""

    # ---- introspection (tests, metrics) ------------------------------------------------------
    @property
    def num_in_flight(self) -> int:
        return len(self._reqs)

    def load(self) -> dict[int, int]:
        return dict(self._load)

    def route_of(self, request_id: str) -> Route:
        return self._route(self._get(request_id))

    # ---- hooks -------------------------------------------------------------------------------
    def _admit_target(self, req: RouterRequest) -> tuple[int, int]:
        bi = self._active[0]
        return bi, self._pick(bi)

    def _on_admit(self, req: RouterRequest) -> None:
        pass

    def _on_tool(self, req: RouterRequest, outcome: OutcomeState) -> Decision:
        return self._stay(req)

    def _on_decode(self, req: RouterRequest) -> Decision:
        return self._stay(req)

    def _on_finish(self, req: RouterRequest, total_tokens: int) -> None:
        pass


class LeastLoadRouter(BaseRouter):
    """Least tokens in flight over every instance, whatever bucket it serves; never migrates."""

    name = "least_load"

    def _admit_target(self, req: RouterRequest) -> tuple[int, int]:
        load = self._load  # ordered by instance id: the first least-loaded one is the lowest id
        iid = min(load, key=load.__getitem__)
        return self._inst_bucket[iid], iid


class LengthAwareRouter(BaseRouter):
    """Routes once at admission by the mean length of the prompt's past trajectories."""

    name = "length_aware"

    def __init__(self, cfg: RouterConfig | None = None) -> None:
        super().__init__(cfg)
        self._history: dict[str, deque[int]] = {}

    def predict(self, prompt_id: str) -> float | None:
        h = self._history.get(prompt_id)
        return sum(h) / len(h) if h else None

    def _admit_target(self, req: RouterRequest) -> tuple[int, int]:
        pred = self.predict(req.prompt_id)
        bi = self._active[0] if pred is None else self._bucket_for_tokens(pred)
        return bi, self._pick(bi)

    def _on_finish(self, req: RouterRequest, total_tokens: int) -> None:
        self._history.setdefault(req.prompt_id, deque(maxlen=self.cfg.length_history)).append(total_tokens)


class LAMLFQRouter(BaseRouter):
    """Length-threshold MLFQ: shortest bucket first, demoted when tokens outgrow the bucket."""

    name = "la_mlfq"

    def _on_tool(self, req: RouterRequest, outcome: OutcomeState) -> Decision:
        return self._demotion(req) or self._stay(req)

    def _on_decode(self, req: RouterRequest) -> Decision:
        return self._demotion(req) or self._stay(req)
