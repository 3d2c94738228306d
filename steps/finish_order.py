"""Which complete GRPO groups make the next finish-order batch, with or without a bound on their trained lag.

A finish-order batch (fully async, AReaL-style) is the first `need` complete groups to finish, from
whichever admitted steps they come. With a trained-lag bound B (libra's designs: the step core's
`bound_trained_lag`), each group has a deadline, its step's admission version + B: the last policy
version whose batch may train it. Earliest deadline first keeps every deadline where a batch holds
`need` groups, and finish order keeps the tail out of the batch wherever a deadline allows:
  1. For each deadline d >= the version V now, the groups due by d need the d - V + 1 batches from
     this one on; the later d - V hold `need` each, so this batch must take at least
     |due by d| - (d - V) x need of them: `required` is the largest such figure (at most `need`).
  2. Those are the `required` groups of earliest deadline (a finished one before a running one at the
     same deadline, then finish order). If one still runs, the batch waits for it.
  3. The rest of the batch: the first groups to finish among the others.
A deadline already past (a design change lowered the bound) counts as due now.

Invariants (tests/steps/test_finish_order.py): a batch is `need` groups, all complete; without a bound
it is the first `need` to finish; with one, no group is trained after its deadline when steps are
admitted at most B versions ahead of the trainer (a design's lookahead is below its bound); a batch
waits only for a group the deadlines force into it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

__all__ = ["next_batch"]


def next_batch(ready: Sequence[Hashable], need: int, deadlines: dict[Hashable, int] | None = None,
               version: int = 0) -> list | None:
    """The groups of the next batch, or None until it can be made.

    `ready`: the complete groups not yet trained, in the order they completed. `deadlines`: every group
    not yet trained (complete or running) -> the last version that may train it; None: no bound.
    `version`: the policy version this batch trains on."""
    if need < 1 or len(ready) < need:
        return None
    if deadlines is None:
        return list(ready[:need])
    position = {k: i for i, k in enumerate(ready)}
    due = {k: max(d, version) for k, d in deadlines.items()}
    order = sorted(due, key=lambda k: (due[k], position.get(k, len(position))))
    required = 0
    for i, k in enumerate(order):
        if i + 1 == len(order) or due[order[i + 1]] != due[k]:  # the last group due by this deadline
            required = max(required, i + 1 - (due[k] - version) * need)
    must = order[: min(need, required)]
    if any(k not in position for k in must):
        return None
    taken = set(must)
    return must + [k for k in ready if k not in taken][: need - len(must)]
