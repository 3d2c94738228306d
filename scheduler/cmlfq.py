"""C-MLFQ: causality-driven multi-level feedback queue over heterogeneous rollout buckets.

Algorithm (Libra, arXiv 2606.03077, section on C-MLFQ):
1. Admission: every request starts in the shortest bucket that has instances, on the
   least-loaded instance there (tokens in flight, ties to the lower id), unless that instance
   would hold `migrate_load_slack` x more tokens per device than a longer bucket's least-loaded
   one: then it starts there (a step admits its whole batch at once; queueing it all on the first
   bucket's few instances while the others idle made libra lose to least-load routing). Between
   instances of the same TP the slack is 1: a longer bucket of equal TP is no faster.
2. Tool return: the outcome state (tool, size class, status) advances the request's cursor in
   the causal prefix tree (its prompt's tree and the global one). The estimate of the tokens
   still to come gives two predicted totals, tokens_so_far + mean and tokens_so_far + p90. Each
   maps to the shortest active bucket whose limit fits it; the request migrates to the shorter
   of the two if that is longer than its current bucket (both signals must agree), else stays.
   The engine re-prefills it on the target. The move is held while the target would hold
   `migrate_load_slack` x more tokens per device than the request's own instance (a swamped
   high-TP instance is no faster seat; the paper's "2-3x faster per token" sets the 2x default;
   1x toward an instance of the same TP).
3. Decode boundary: a request that outgrew its bucket's limit without a tool return is demoted
   to the bucket that fits its tokens (the MLFQ safety net; `RouterConfig.demote`), held by the
   same crowding rule as a causal move: a layout with one long instance (the first layout, before
   the planner has seen a length) otherwise queues every over-limit request of a step behind it
   (measured: 160x910B3 math, the first step took 1368 s against least-load routing's 797 s).
   A held request stays where it decodes and is looked at again at its next tool return or
   progress report.
4. Finish: the request's (prompt, outcomes, tokens at each, total) record feeds the tree, which
   is rebuilt every `rebuild_every` finishes from the last `window` records. `tree_json()` /
   `load_tree_json` (the `Router` protocol's learned state) warm-start a run from the previous one's tree.

Never to a shorter bucket, at most one migration per event, O(1) per event (plus a re-walk of the
request's own outcome list once after a rebuild).

Invariants (tests/scheduler/test_scheduler_cmlfq.py): trained on traces where a failure outcome is followed
by long continuations and success by short ones, a failure migrates and a success stays; no
migration without tree evidence unless the token limit is exceeded; decisions are deterministic;
admission spills, causal moves and demotions are held exactly at the per-device load ratio.
"""

from __future__ import annotations

import logging

from scheduler.api import Decision, OutcomeState, Route
from scheduler.layout import RoleMap
from scheduler.prefix_tree import CausalPrefixTree
from scheduler.routers import BaseRouter, RouterConfig, RouterRequest

logger = logging.getLogger(__name__)


class CMLFQRouter(BaseRouter):
    name = "cmlfq"

    def __init__(self, cfg: RouterConfig | None = None, tree: CausalPrefixTree | None = None) -> None:
        super().__init__(cfg)
        self.tree = tree or CausalPrefixTree(self.cfg.tree)
        self.num_causal_migrations = 0
        self.num_load_holds = 0  # causal moves and demotions skipped because the target was crowded

    def _crowded(self, req: RouterRequest, target: int) -> bool:
        """A high-TP instance is faster per token only while it is not swamped: when every instance
        of the target holds `migrate_load_slack` x more tokens per device than the request's own,
        the move would trade a re-prefill for a slower seat. Token-limit demotions are held by it too."""
        here = self._per_device(req.instance_id)
        return all(self._per_device(i, req.tokens) > self._slack(req.instance_id, i) * here
                   for i in self._by_bucket[target])

    def _slack(self, here: int, there: int) -> float:
        """How much fuller (per device) a seat may be and still be worth taking: `migrate_load_slack`
        on an instance of higher TP, 1 on one of the same TP, which decodes no faster (CPU runs
        have TP1 only: a 2x slack there left the long bucket's rank idle, libra below static)."""
        return self.cfg.migrate_load_slack if self._tp[there] > self._tp[here] else 1.0

    def _admit_target(self, req: RouterRequest) -> tuple[int, int]:
        """The shortest bucket, unless it is crowded: a step admits its whole batch at once, and
        queueing hundreds of prompts on the few instances of the first bucket while longer buckets
        idle costs more than starting some of them higher (they never need a migration). So move
        up a bucket while its least-loaded instance would hold `migrate_load_slack` x fewer tokens
        per device than the best so far (the request's own tokens counted on both sides)."""
        first = self._active[0]
        best = self._pick(first)
        for bi in self._active[1:]:
            cand = self._pick(bi)
            if not self._per_device(cand, req.tokens) * self._slack(best, cand) < self._per_device(best, req.tokens):
                break
            first, best = bi, cand
        return first, best

    def _per_device(self, instance_id: int, extra_tokens: int = 0) -> float:
        return (self._load[instance_id] + extra_tokens) / self._tp[instance_id]

    def set_layout(self, role_map: RoleMap, now: float) -> dict[str, Route]:
        self._tp = {i.instance_id: i.tp for i in role_map.instances}
        return super().set_layout(role_map, now)

    def _on_admit(self, req: RouterRequest) -> None:
        req.cursor = self.tree.cursor(req.prompt_id)

    def _on_tool(self, req: RouterRequest, outcome: OutcomeState) -> Decision:
        tree = self.tree
        tree.advance(req.cursor, outcome)
        # in the longest active bucket a request has nowhere to go: no estimate needed
        est = tree.estimate(req.cursor) if req.bucket != self._active[-1] else None
        if est is not None:
            mean_total, tail_total = req.tokens + est.mean, req.tokens + est.tail
            target = min(self._bucket_for_tokens(mean_total), self._bucket_for_tokens(tail_total))
            if target > req.bucket and self._crowded(req, target):
                self.num_load_holds += 1
            elif target > req.bucket:
                self.num_causal_migrations += 1
                reason = f"cmlfq[{est.source}] mean={mean_total:.0f} p={tail_total:.0f} n={est.count}"
                return self._migrate(req, target, reason)
        return (self.cfg.demote and self._demotion(req)) or self._stay(req)

    def _hold_demotion(self, req: RouterRequest, target: int) -> bool:
        if self._crowded(req, target):
            self.num_load_holds += 1
            return True
        return False

    def _on_decode(self, req: RouterRequest) -> Decision:
        if self.cfg.demote:
            return self._demotion(req) or self._stay(req)
        return self._stay(req)

    def _on_finish(self, req: RouterRequest, total_tokens: int) -> None:
        if self.tree.add(self.record_of(req, total_tokens)):
            logger.debug("prefix tree rebuilt from %d trajectories (generation %d)", self.tree.num_records,
                         self.tree.generation)

    # ---- learned state: checkpoints and warm starts (the caller reads/writes the file) --------
    def tree_json(self) -> str | None:
        return self.tree.to_json()

    def load_tree_json(self, text: str) -> None:
        self.tree = CausalPrefixTree.from_json(text, self.cfg.tree)
        for req in self._reqs.values():
            outcomes = req.cursor.outcomes if req.cursor is not None else []
            req.cursor = self.tree.cursor(req.prompt_id)
            req.cursor.outcomes = list(outcomes)
            req.cursor.generation = -1  # forces a re-walk in the new tree
