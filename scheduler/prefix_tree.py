"""Causal prefix tree: from the sequence of tool outcomes seen so far, predict the tokens still to come.

C-MLFQ's length signal. A finished trajectory is recorded as its prompt id, the outcome state of
each tool return (tool, size class, status), the tokens generated when each outcome arrived, and
its total tokens. From the last `window` records the tree is rebuilt every `rebuild_every`
records:

1. Walk each record down two tries keyed by outcome states: one for its prompt and one global.
   At depth d (after d tool returns) the node collects the sample `total - tokens_at[d-1]`
   (at the root: `total - prompt_tokens`), i.e. the tokens that were still to come. A record
   leaving the window takes its samples out again, so the samples always are the window's.
2. At a rebuild, freeze each changed node into (count, mean, p-quantile) of its samples, and a
   fallback table keyed by the last outcome alone (all depths pooled). Queries read only frozen
   statistics, so between rebuilds they see the tree as of the last one.
3. A query takes the deepest exact match with at least `min_samples` samples, preferring the
   prompt's own tree, then the global tree, then the last-outcome table; none -> no estimate.

Queries are O(1) per tool return: callers keep a `Cursor` (the two current nodes) and advance it
with `advance`; a cursor made before a rebuild is re-walked from its outcome list once (the tree
has a `generation` counter). The tree serialises to JSON (its records), so a run can warm-start
from the previous one; the scheduler does no I/O, the caller writes the string.

Invariants (tests/test_scheduler_cmlfq.py): estimates are exact mean and nearest-rank quantile of
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

    __slots__ = ("children", "samples", "total", "count", "mean", "tail")

    def __init__(self) -> None:
        self.children: dict[OutcomeState, Node] = {}
        self.samples: list[int] = []  # sorted; changes as records enter and leave the window
        self.total = 0  # sum of samples
        self.count, self.mean, self.tail = 0, 0.0, 0.0  # what queries read: as of the last rebuild

    def freeze(self, quantile: float) -> None:
        s = self.samples
        self.count = len(s)
        self.mean = self.total / len(s) if s else 0.0
        self.tail = float(s[max(0, math.ceil(quantile * len(s)) - 1)]) if s else 0.0


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
        self._emptied: list[tuple[dict, object, Node]] = []  # (parent's dict, key, node) left without samples

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
        self._apply(record, +1)
        if len(self._records) > self.cfg.window:
            self._apply(self._records.popleft(), -1)

    def rebuild(self) -> None:
        """Publish the window's statistics to queries. The samples are kept up to date as records
        enter and leave the window (a sorted list per node), so only changed nodes are refrozen:
        the same statistics as a rebuild from scratch, at a cost that follows the new records."""
        q = self.cfg.quantile
        for node in self._dirty:
            node.freeze(q)
        self._dirty.clear()
        for parent, key, node in self._emptied:  # count 0 reads as absent: unhook it so memory follows the window
            if not node.samples and parent.get(key) is node:
                del parent[key]
        self._emptied.clear()
        self._since_rebuild = 0
        self.generation += 1

    def _apply(self, rec: TrajectoryRecord, sign: int) -> None:
        """Add (sign +1) or remove (-1) one record's samples along its paths in both tries and the last-outcome table."""
        g = self._global
        p = self._prompts.get(rec.prompt_id)
        if p is None:
            p = self._prompts[rec.prompt_id] = Node()
        remaining = rec.total_tokens - rec.prompt_tokens
        # (node, sample, where it hangs): a node a removal empties is unhooked at the next rebuild
        touched = [(g, remaining, None, None), (p, remaining, self._prompts, rec.prompt_id)]
        last = self._last
        for outcome, at in zip(rec.outcomes, rec.tokens_at):
            remaining = max(0, rec.total_tokens - at)
            up_g, up_p = g.children, p.children
            g = up_g.get(outcome) or up_g.setdefault(outcome, Node())
            p = up_p.get(outcome) or up_p.setdefault(outcome, Node())
            node = last.get(outcome) or last.setdefault(outcome, Node())
            touched += ((g, remaining, up_g, outcome), (p, remaining, up_p, outcome), (node, remaining, last, outcome))
        dirty = self._dirty
        for node, value, parent, key in touched:
            if sign > 0:
                bisect.insort(node.samples, value)
                node.total += value
            else:
                del node.samples[bisect.bisect_left(node.samples, value)]
                node.total -= value
                if not node.samples and parent is not None:
                    self._emptied.append((parent, key, node))
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
        for node, source in ((cur.prompt_node, "prompt"), (cur.global_node, "global")):
            if node is not None and node.count >= k:
                return Estimate(node.mean, node.tail, node.count, source)
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
