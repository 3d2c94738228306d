"""Finish-order batches (steps/finish_order.py): the first complete groups, and a trained-lag bound kept by deadlines."""

import random

from steps.finish_order import next_batch


def test_without_a_bound_a_batch_is_the_first_groups_to_finish():
    assert next_batch(["c", "a", "b"], 2) == ["c", "a"]
    assert next_batch(["c"], 2) is None and next_batch([], 0) is None


def test_a_due_group_comes_first_and_the_batch_waits_for_it():
    deadlines = {"old": 3, "new1": 5, "new2": 5, "new3": 5}
    assert next_batch(["new1", "new2", "new3"], 2, deadlines, version=3) is None  # "old" must train now, and runs
    assert next_batch(["new1", "new2", "old", "new3"], 2, deadlines, version=3) == ["old", "new1"]
    assert next_batch(["new1", "new2", "old"], 2, deadlines, version=2) == ["new1", "new2"]  # one more batch for "old"


def test_groups_due_soon_are_spread_so_later_batches_can_hold_them():
    # three groups due by version 4 and two batches (versions 3, 4) of two: this batch must take one of them
    deadlines = {"a": 4, "b": 4, "c": 4, "x": 9, "y": 9}
    assert next_batch(["x", "y", "b", "a"], 2, deadlines, version=3) == ["b", "x"]
    assert next_batch(["x", "y", "a"], 2, deadlines, version=3) == ["a", "x"]


def test_a_past_deadline_counts_as_due_now():
    assert next_batch(["x", "late"], 1, {"late": 1, "x": 8}, version=5) == ["late"]


def test_random_runs_never_train_a_group_past_its_deadline():
    """Steps of `need` groups admitted `lookahead` versions ahead, groups finishing in random order, bound B >= L."""
    for seed in range(50):
        rng = random.Random(seed)
        need, lookahead = rng.randint(1, 4), rng.randint(1, 3)
        bound = lookahead + rng.randint(0, 2)
        version, steps, admitted, running, ready, deadlines = 0, 12, 0, [], [], {}
        while version < steps:
            while admitted < steps and admitted <= version + lookahead:
                for g in range(need):
                    key = (admitted, g)
                    running.append(key)
                    deadlines[key] = version + bound
                admitted += 1
            batch = next_batch(ready, need, deadlines, version)
            if batch is None:  # a group finishes
                ready.append(running.pop(rng.randrange(len(running))))
                continue
            assert len(batch) == need and all(version <= deadlines[k] for k in batch), (seed, version, batch)
            for k in batch:
                ready.remove(k)
                del deadlines[k]
            version += 1
        assert not deadlines and not ready and not running
