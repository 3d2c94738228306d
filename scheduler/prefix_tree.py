"""Causal prefix tree: from the sequence of tool outcomes seen so far, predict the tokens still to come.

C-MLFQ's length signal. A finished trajectory is recorded as its prompt id, the outcome state of
each tool return (tool, size class, status), the tokens generated when each outcome arrived, and
its total tokens. From the last `window` records the tree is rebuilt every `rebuild_every`
records:

1. Walk each record down two tries keyed by outcome states: one for its prompt and one global.
   At depth d (after d tool returns) the node collects the sample `total - tokens_at[d-1]`
   (at the root: `total - prompt_tokens`), i.e. the tokens that were still to come. A record
   leaving the window takes its samples out again, so the samples always are the window's.
2. A rebuild publishes the window (a new `generation`): queries see the tree as of the last
   rebuild. The tries are brought to that window when a query first reads them: the records
   that left it are walked out and the new ones in (a sorted list of samples per node), so a
   router that asks nothing (every request in its longest bucket) keeps only the records.
   Beside the tries, a fallback table keyed by the last outcome alone (all depths pooled). A
   node left without samples is unhooked (count 0 reads as absent) and kept for reuse as a new
   node. A query reads a node's (count, mean, p-quantile) off its samples (a sorted list and
   their running sum).
3. A query takes the deepest exact match with at least `min_samples` samples, preferring the
   prompt's own tree, then the global tree, then the last-outcome table; none -> no estimate.

Queries are O(1) per tool return: callers keep a `Cursor` (the two current nodes) and advance it
with `advance`; a cursor made before a rebuild is re-walked from its outcome list once, when an
estimate next reads it (the tree has a `generation` counter); the first query after a rebuild
also brings the tries up to it. The tree serialises to JSON (its records), so a run can
warm-start from the previous one; the scheduler does no I/O, the caller writes the string.

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
    """A trie node: its samples as of the last rebuild, kept sorted, and their sum."""

    __slots__ = ("children", "samples", "total")

    def __init__(self) -> None:
        self.children: dict[OutcomeState, Node] = {}
        self.samples: list[int] = []  # sorted; changes only at a rebuild, as records enter and leave the window
        self.total = 0  # sum of the samples (integers: kept exactly as they enter and leave)

    def estimate(self, quantile: float, source: str) -> Estimate:
        """(mean, nearest-rank `quantile`, count) of the samples (at least one)."""
        s = self.samples
        n = len(s)
        # total / n = sum(s) / n: the running sum of integer samples is exact
        return Estimate(self.total / n, float(s[max(0, math.ceil(quantile * n) - 1)]), n, source)


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
        self._records: deque[TrajectoryRecord] = deque()  # the window
        self._added = 0  # records ever added
        self._snapshot: tuple[TrajectoryRecord, ...] = ()  # the window as of the last rebuild ...
        self._snapshot_end = 0  # ... and `_added` then
        # each record in the tries, oldest first: (it, the nodes `_add` put its samples in, where each hangs,
        # its samples), so that `_remove` need not walk the tries again (its nodes hold its samples: they stay hooked)
        self._paths: deque[tuple] = deque()
        self._paths_end = 0  # `_added` when the records in the tries were the window
        self._built = 0  # the generation the tries show (`_sync`)
        self._since_rebuild = 0
        self.generation = 0
        self._global = Node()
        self._prompts: dict[str, Node] = {}
        self._last: dict[OutcomeState, Node] = {}
        self._emptied: list = []  # parent's dict, key, parent's dict, key, ... of the nodes left without samples
        self._spare: list[Node] = []  # nodes unhooked by `_sync`, for `_node` to hang again

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
        self._added += 1
        if len(self._records) > self.cfg.window:
            self._records.popleft()

    def rebuild(self) -> None:
        """Publish the window to queries (module docstring, 2); the tries follow when first read (`_sync`)."""
        self._snapshot, self._snapshot_end = tuple(self._records), self._added
        self._since_rebuild = 0
        self.generation += 1

    def _sync(self) -> None:
        """Bring the tries to the window of the last rebuild: walk the records that left it out and the new ones
        in (a sorted list of samples per node): the same statistics as a rebuild from scratch, at a cost that
        follows the records that changed (all of them when the tries were last read a window ago or more)."""
        if self._built == self.generation:
            return
        target, end, paths = self._snapshot, self._snapshot_end, self._paths
        start = end - len(target)  # the window's first record, counted as `_added` counts
        if self._paths_end <= start:  # nothing in common: start over
            self._global, self._prompts, self._last = Node(), {}, {}
            paths.clear()
            self._emptied.clear()
            first = start
        else:
            for _ in range(start - (self._paths_end - len(paths))):  # the records that left the window
                self._remove(*paths.popleft())
            first = self._paths_end
        for rec in target[first - start:]:
            paths.append((rec, *self._add(rec)))
        self._paths_end, self._built = end, self.generation
        emptied = iter(self._emptied)
        for parent, key in zip(emptied, emptied):  # count 0 reads as absent: unhook it so memory follows the window
            node = parent.get(key)
            if node is not None and not node.samples:
                del parent[key]
                self._spare.append(node)
        self._emptied.clear()

    def _add(self, rec: TrajectoryRecord) -> tuple[list[Node], list, list[int]]:
        """Add one record's samples along its paths in both tries and the last-outcome table; returns
        (every node of its paths, the dict each hangs in, the sample each got) for `_remove`."""
        g, prompts = self._global, self._prompts
        p = prompts.get(rec.prompt_id)
        if p is None:
            p = prompts[rec.prompt_id] = self._node()
        total, last, insort, new = rec.total_tokens, self._last, bisect.insort, self._node
        remaining = total - rec.prompt_tokens
        nodes, ups, rems = [g, p], [None, prompts], [remaining, remaining]
        for outcome, at in zip(rec.outcomes, rec.tokens_at):
            remaining = total - at if total > at else 0
            up_g, up_p = g.children, p.children
            g = up_g.get(outcome) or up_g.setdefault(outcome, new())
            p = up_p.get(outcome) or up_p.setdefault(outcome, new())
            nodes += (g, p, last.get(outcome) or last.setdefault(outcome, new()))
            ups += (up_g, up_p, last)
            rems += (remaining, remaining, remaining)
        for node, remaining in zip(nodes, rems):
            insort(node.samples, remaining)
            node.total += remaining
        return nodes, ups, rems

    def _node(self) -> Node:
        """A new node (called only where one is hung): one unhooked by `_sync` if any. Such a node
        holds no sample nor child (a child holds a subset of its parent's samples, so it was
        unhooked too) and nothing reads it (cursors re-walk after a rebuild); a run makes and drops
        about a million nodes, and each new object costs its allocation and a garbage-collector scan."""
        if not self._spare:
            return Node()
        node = self._spare.pop()
        assert not node.samples and not node.children and not node.total
        return node

    def _remove(self, rec: TrajectoryRecord, nodes: list[Node], ups: list, rems: list[int]) -> None:
        """Take out the samples `_add` put in (the record left the window; its nodes hold them, so
        they are all still hooked). A node left without samples is unhooked at the end of `_sync`."""
        emptied, bisect_left = self._emptied, bisect.bisect_left
        keys = (rec.prompt_id, *rec.outcomes)  # the key each node hangs by (the root's is never read)
        for i, (node, remaining) in enumerate(zip(nodes, rems)):
            samples = node.samples
            del samples[bisect_left(samples, remaining)]
            node.total -= remaining
            if not samples and i:
                emptied += (ups[i], keys[(i + 1) // 3])

    # ---- queries ----------------------------------------------------------------------------
    def cursor(self, prompt_id: str) -> Cursor:
        """A cursor at the prompt's roots, walked when an estimate first reads it."""
        return Cursor(prompt_id)

    def _rewalk(self, cur: Cursor) -> None:
        self._sync()
        p, g = self._prompts.get(cur.prompt_id), self._global
        for outcome in cur.outcomes:
            p = p.children.get(outcome) if p is not None else None
            g = g.children.get(outcome) if g is not None else None
        cur.prompt_node, cur.global_node, cur.generation = p, g, self.generation

    def advance(self, cur: Cursor, outcome: OutcomeState) -> None:
        cur.outcomes.append(outcome)
        if cur.generation != self.generation:  # walked again from its outcomes when an estimate reads it
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
        if node is not None and len(node.samples) >= k:
            return node.estimate(self.cfg.quantile, "prompt")
        node = cur.global_node
        if node is not None and len(node.samples) >= k:
            return node.estimate(self.cfg.quantile, "global")
        if cur.outcomes:
            node = self._last.get(cur.outcomes[-1])
            if node is not None and len(node.samples) >= k:
                return node.estimate(self.cfg.quantile, "last")
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
