"""Causal prefix tree: from the sequence of tool outcomes seen so far, predict the tokens still to come.

C-MLFQ's length signal. A finished trajectory is recorded as its prompt id, the outcome state of
each tool return (tool, size class, status), the tokens generated when each outcome arrived, and
its total tokens. From the last `window` records the tree is rebuilt every `rebuild_every`
records:

1. Walk each record down two tries keyed by outcome states: one for its prompt and one global.
   At depth d (after d tool returns) the node collects the sample `total - tokens_at[d-1]`
   (at the root: `total - prompt_tokens`), i.e. the tokens that were still to come. A record
   leaving the window takes its samples out again, so the samples always are the window's.
2. At a rebuild, freeze each changed node into (count, mean, p-quantile) of its samples (mean
   and p-quantile only where a query reads them: at least `min_samples` samples), and a
   fallback table keyed by the last outcome alone (all depths pooled). Queries read only frozen
   statistics, so between rebuilds they see the tree as of the last one. A node left without
   samples is unhooked (count 0 reads as absent) and kept for reuse as a new node.
3. A query takes the deepest exact match with at least `min_samples` samples, preferring the
   prompt's own tree, then the global tree, then the last-outcome table; none -> no estimate.

Queries are O(1) per tool return: callers keep a `Cursor` (the two current nodes) and advance it
with `advance`; a cursor made before a rebuild is re-walked from its outcome list once (the tree
has a `generation` counter). The tree serialises to JSON (its records), so a run can warm-start
from the previous one; the scheduler does no I/O, the caller writes the string.

Invariants (tests/scheduler/test_scheduler_cmlfq.py): estimates are exact mean and nearest-rank quantile of
the samples; a rebuild happens exactly every `rebuild_every` records; the tree only reflects the
last `window` records; `from_json(to_json())` gives identical estimates.
"""

from __future__ import annotations

import bisect
import json
import math
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from scheduler.api import OutcomeState


@dataclass(frozen=True, kw_only=True)
class PrefixTreeConfig:
    window: int = 2000  # rebuild from the last N finished trajectories
    rebuild_every: int = 64  # rebuild after every M finished trajectories
    min_samples: int = 4  # a node with fewer samples is not trusted (fall back to a coarser one)
    quantile: float = 0.9  # the tail statistic next to the mean (paper: p90)

    def __post_init__(self) -> None:
        if self.window < 1 or self.rebuild_every < 1:
            raise ValueError(
                f"PrefixTreeConfig: window={self.window} and rebuild_every={self.rebuild_every} must be >= 1; "
                "e.g. window=2000, rebuild_every=64"
            )
        if self.min_samples < 1:
            raise ValueError(f"PrefixTreeConfig: min_samples={self.min_samples} must be >= 1; use 1 to trust any node")
        if not 0 < self.quantile <= 1:
            raise ValueError(f"PrefixTreeConfig: quantile={self.quantile} must be in (0, 1]; the paper uses 0.9")


@dataclass(frozen=True, kw_only=True)
class TrajectoryRecord:
    prompt_id: str  # key of the per-prompt tree
    prompt_tokens: int  # tokens at admission
    outcomes: tuple[OutcomeState, ...]  # one per tool return, in order
    tokens_at: tuple[int, ...]  # tokens generated so far when each outcome arrived
    total_tokens: int  # tokens at finish


class Estimate(NamedTuple):
    mean: float  # mean remaining tokens
    tail: float  # `quantile` of remaining tokens
    count: int  # samples behind it
    source: str  # "prompt" | "global" | "last"


class Node:
    """A trie node: its live samples, kept sorted, and the statistics frozen at the last rebuild."""

    __slots__ = ("children", "samples", "count", "mean", "tail")

    def __init__(self) -> None:
        self.children: dict[OutcomeState, Node] = {}
        self.samples: list[int] = []  # sorted; changes as records enter and leave the window
        self.count, self.mean, self.tail = 0, 0.0, 0.0  # what queries read: as of the last rebuild

    def freeze(self, quantile: float, min_samples: int) -> None:
        """Publish the count, and the mean and tail where a query reads them (count >= min_samples;
        most nodes, deep in a trie, hold fewer samples and are never read past their count)."""
        s = self.samples
        n = self.count = len(s)
        if n >= min_samples:
            self.mean = sum(s) / n
            self.tail = float(s[max(0, math.ceil(quantile * n) - 1)])


class Cursor:
    """Where one in-flight request is in the tries; cheap to advance per tool return."""

    __slots__ = ("prompt_id", "outcomes", "prompt_node", "global_node", "generation")

    def __init__(self, prompt_id: str) -> None:
        self.prompt_id = prompt_id
        self.outcomes: list[OutcomeState] = []
        self.prompt_node: Node | None = None
        self.global_node: Node | None = None
        self.generation = -1


class CausalPrefixTree:
    def __init__(self, cfg: PrefixTreeConfig | None = None) -> None:
        self.cfg = cfg or PrefixTreeConfig()
        self._records: deque[TrajectoryRecord] = deque()
        self._since_rebuild = 0
        self.generation = 0
        self._global = Node()
        self._prompts: dict[str, Node] = {}
        self._last: dict[OutcomeState, Node] = {}
        self._dirty: set[Node] = set()  # nodes whose samples changed since the last rebuild
        self._emptied: list = []  # parent's dict, key, parent's dict, key, ... of the nodes left without samples
        self._spare: list[Node] = []  # nodes unhooked at a rebuild, for `_node` to hang again

    @property
    def num_records(self) -> int:
        return len(self._records)

    def add(self, record: TrajectoryRecord) -> bool:
        """Record a finished trajectory; return True when this call rebuilt the tree."""
        assert len(record.outcomes) == len(record.tokens_at), "one token count per outcome"
        self._append(record)
        self._since_rebuild += 1
        if self._since_rebuild >= self.cfg.rebuild_every:
            self.rebuild()
            return True
        return False

    def _append(self, record: TrajectoryRecord) -> None:
        self._records.append(record)
        self._add(record)
        if len(self._records) > self.cfg.window:
            self._remove(self._records.popleft())

    def rebuild(self) -> None:
        """Publish the window's statistics to queries. The samples are kept up to date as records
        enter and leave the window (a sorted list per node), so only changed nodes are refrozen:
        the same statistics as a rebuild from scratch, at a cost that follows the new records."""
        emptied = iter(self._emptied)
        for parent, key in zip(emptied, emptied):  # count 0 reads as absent: unhook it so memory follows the window
            node = parent.get(key)
            if node is not None and not node.samples:
                del parent[key]
                self._spare.append(node)
        self._emptied.clear()
        q, k = self.cfg.quantile, self.cfg.min_samples
        for node in self._dirty:
            node.freeze(q, k)
        self._dirty.clear()
        self._since_rebuild = 0
        self.generation += 1

    def _add(self, rec: TrajectoryRecord) -> None:
        """Add one record's samples along its paths in both tries and the last-outcome table."""
        g = self._global
        p = self._prompts.get(rec.prompt_id)
        if p is None:
            p = self._prompts[rec.prompt_id] = self._node()
        total, last, insort = rec.total_tokens, self._last, bisect.insort
        remaining = total - rec.prompt_tokens
        insort(g.samples, remaining)
        insort(p.samples, remaining)
        nodes = [g, p]  # every node of its paths
        for outcome, at in zip(rec.outcomes, rec.tokens_at):
            remaining = max(0, total - at)
            g = g.children.get(outcome) or g.children.setdefault(outcome, self._node())
            p = p.children.get(outcome) or p.children.setdefault(outcome, self._node())
            node = last.get(outcome) or last.setdefault(outcome, self._node())
            insort(g.samples, remaining)
            insort(p.samples, remaining)
            insort(node.samples, remaining)
            nodes += (g, p, node)
        self._dirty.update(nodes)

    def _node(self) -> Node:
        """A new node (called only where one is hung): one unhooked at a rebuild if any. Such a node
        holds no sample nor child (a child holds a subset of its parent's samples, so it was
        unhooked too) and nothing reads it (cursors re-walk after a rebuild); a run makes and drops
        about a million nodes, and each new object costs its allocation and a garbage-collector scan."""
        if not self._spare:
            return Node()
        node = self._spare.pop()
        assert not node.samples and not node.children
        node.count, node.mean, node.tail = 0, 0.0, 0.0  # as a new node reads until the next rebuild
        return node

    def _remove(self, rec: TrajectoryRecord) -> None:
        """Take out the samples `_add` put in (the record left the window; its nodes hold them, so
        they are all still hooked). A node left without samples is unhooked at the next rebuild."""
        emptied, dirty, bisect_left = self._emptied, self._dirty, bisect.bisect_left
        total, last = rec.total_tokens, self._last
        remaining = total - rec.prompt_tokens
        g, p = self._global, self._prompts[rec.prompt_id]
        for node in (g, p):
            samples = node.samples
            del samples[bisect_left(samples, remaining)]
            dirty.add(node)
        if not p.samples:
            emptied += (self._prompts, rec.prompt_id)
        for outcome, at in zip(rec.outcomes, rec.tokens_at):
            remaining = max(0, total - at)
            up_g, up_p = g.children, p.children
            g, p = up_g[outcome], up_p[outcome]
            for up, node in ((up_g, g), (up_p, p), (last, last[outcome])):  # each node and where it hangs
                samples = node.samples
                del samples[bisect_left(samples, remaining)]
                if not samples:
                    emptied += (up, outcome)
                dirty.add(node)

    # ---- queries ----------------------------------------------------------------------------
    def cursor(self, prompt_id: str) -> Cursor:
        cur = Cursor(prompt_id)
        self._rewalk(cur)
        return cur

    def _rewalk(self, cur: Cursor) -> None:
        p, g = self._prompts.get(cur.prompt_id), self._global
        for outcome in cur.outcomes:
            p = p.children.get(outcome) if p is not None else None
            g = g.children.get(outcome) if g is not None else None
        cur.prompt_node, cur.global_node, cur.generation = p, g, self.generation

    def advance(self, cur: Cursor, outcome: OutcomeState) -> None:
        cur.outcomes.append(outcome)
        if cur.generation != self.generation:
            self._rewalk(cur)
            return
        if cur.prompt_node is not None:
            cur.prompt_node = cur.prompt_node.children.get(outcome)
        if cur.global_node is not None:
            cur.global_node = cur.global_node.children.get(outcome)

    def estimate(self, cur: Cursor) -> Estimate | None:
        """Remaining tokens after the outcomes the cursor has seen, or None without enough data."""
        if cur.generation != self.generation:
            self._rewalk(cur)
        k = self.cfg.min_samples
        node = cur.prompt_node
        if node is not None and node.count >= k:
            return Estimate(node.mean, node.tail, node.count, "prompt")
        node = cur.global_node
        if node is not None and node.count >= k:
            return Estimate(node.mean, node.tail, node.count, "global")
        if cur.outcomes:
            node = self._last.get(cur.outcomes[-1])
            if node is not None and node.count >= k:
                return Estimate(node.mean, node.tail, node.count, "last")
        return None

    def predict(self, prompt_id: str, outcomes: list[OutcomeState] | tuple[OutcomeState, ...]) -> Estimate | None:
        """Convenience for tests and offline use: estimate for a whole outcome sequence."""
        cur = Cursor(prompt_id)
        cur.outcomes = list(outcomes)
        self._rewalk(cur)
        return self.estimate(cur)

    # ---- persistence (the caller does the file I/O) -------------------------------------------
    def to_json(self) -> str:
        recs = [
            [r.prompt_id, r.prompt_tokens, [list(o) for o in r.outcomes], list(r.tokens_at), r.total_tokens]
            for r in self._records
        ]
        return json.dumps({"format": "libra-prefix-tree/1", "records": recs})

    @classmethod
    def from_json(cls, text: str, cfg: PrefixTreeConfig | None = None) -> CausalPrefixTree:
        data = json.loads(text)
        if data.get("format") != "libra-prefix-tree/1":
            raise ValueError(f"prefix tree JSON has format {data.get('format')!r}; expected 'libra-prefix-tree/1'")
        tree = cls(cfg)
        for pid, ptok, outs, at, total in data["records"]:
            tree._append(
                TrajectoryRecord(prompt_id=pid, prompt_tokens=int(ptok), outcomes=tuple(OutcomeState(*o) for o in outs),
                                 tokens_at=tuple(int(x) for x in at), total_tokens=int(total))
            )
        tree.rebuild()
        return tree
