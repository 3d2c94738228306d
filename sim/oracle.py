"""The clairvoyant oracle: knows every trajectory's length and tool times before it starts.

It is the yardstick every system is compared with (simulation only). The oracle
1. admits each batch longest-first (the simulator sorts it when `longest_first=True`),
2. places each trajectory, once, on the instance that minimises its predicted finish time
   (greedy longest-processing-time list scheduling: the instance's queued decode work over its
   full-batch throughput, but never faster than its per-token latency times the trajectory's
   length), so it never migrates and never re-prefills,
3. and runs with free weight sync and free reconfiguration (it knows what to prefetch).
`sim/run.py` plays this schedule over several layouts (libra's planner, a homogeneous planner,
a fixed split, colocation), and libra's own schedule beside them, and keeps the fastest, so the
oracle is the best schedule we know, not a proof of optimality.

Invariants (tests/sim/test_sim_oracle.py, tests/sim/test_sim_run.py): the clairvoyant router never migrates (the
oracle migrates only when libra's own schedule is the best known); no system's throughput beats
the oracle's on the same workload and seed.
"""

from __future__ import annotations

from scheduler.api import Decision, OutcomeState, Route
from scheduler.layout import RoleMap


class OracleRouter:
    """Router protocol with perfect knowledge, fed by `know(specs)` before each batch is admitted."""

    def __init__(self, cost, max_seqs_per_instance: int):
        self.cost = cost
        self.max_seqs_per_instance = max_seqs_per_instance
        self.specs: dict[str, object] = {}
        self.where: dict[str, int] = {}
        self.load: dict[int, float] = {}  # decode tokens assigned and not finished, per instance
        self.rate: dict[int, tuple[float, float]] = {}  # instance -> (tokens/s at full batch, s/token alone)
        self.role_map: RoleMap | None = None

    def know(self, specs) -> None:
        for s in specs:
            self.specs[s.request_id] = s

    def set_layout(self, role_map: RoleMap, now: float) -> dict[str, Route]:
        self.role_map = role_map
        ctx = 4096  # a representative context; only the ranking of instances matters here
        self.rate = {}
        for inst in role_map.instances:
            cap = self.max_seqs_per_instance
            full = self.cost.decode_step_s(cap, ctx, inst.tp)
            alone = self.cost.decode_step_s(max(1, cap // 4), ctx, inst.tp)
            self.rate[inst.instance_id] = (cap / full, alone)
        self.load = {iid: 0.0 for iid in self.rate}
        moved = {}
        for rid, iid in list(self.where.items()):
            if iid not in self.rate:
                new = self._best(self.specs[rid].decode_tokens)
                self.where[rid] = new
                self.load[new] += self.specs[rid].decode_tokens
                moved[rid] = Route(instance_id=new, bucket=self.role_map.instance(new).bucket)
            else:
                self.load[iid] += self.specs[rid].decode_tokens
        return moved

    def _best(self, num_tokens: int) -> int:
        def finish(iid: int) -> tuple[float, float, int]:
            thr, per_token = self.rate[iid]
            queued = (self.load[iid] + num_tokens) / thr
            # a long trajectory's latency bound ties on equal instances: the queue then decides
            return (max(queued, num_tokens * per_token), queued, iid)

        return min(self.rate, key=finish)

    def admit(self, request_id: str, prompt_id: str, prompt_tokens: int, now: float) -> Route:
        n = self.specs[request_id].decode_tokens
        iid = self._best(n)
        self.where[request_id] = iid
        self.load[iid] += n
        return Route(instance_id=iid, bucket=self.role_map.instance(iid).bucket)

    def _stay(self, request_id: str) -> Decision:
        iid = self.where[request_id]
        return Decision(action="stay", instance_id=iid, bucket=self.role_map.instance(iid).bucket)

    def on_tool_return(self, request_id: str, outcome: OutcomeState, tokens_so_far: int, now: float) -> Decision:
        return self._stay(request_id)

    def on_decode(self, request_id: str, tokens_so_far: int, now: float) -> Decision:
        return self._stay(request_id)

    def on_finish(self, request_id: str, total_tokens: int, now: float) -> None:
        iid = self.where.pop(request_id)
        if iid in self.load:
            self.load[iid] -= self.specs.pop(request_id).decode_tokens

    def on_cancel(self, request_id: str, now: float) -> None:
        self.on_finish(request_id, 0, now)

    def tree_json(self) -> str | None:
        return None  # it knows every length already: nothing learned to keep

    def load_tree_json(self, text: str) -> None:
        """Nothing to warm-start: the oracle is told every length up front (`know`)."""
