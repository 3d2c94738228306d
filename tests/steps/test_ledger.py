"""The trajectory ledger: trained once or dropped with a reason, nothing else."""

import pytest

from steps.ledger import Ledger


def test_every_started_trajectory_ends_trained_or_dropped():
    led = Ledger()
    for rid in ("a", "b", "c", "d"):
        led.start(rid, step=0)
    led.finish("a")
    led.train("a", "task-1")
    led.drop("b", "tool_infra")
    led.finish("c")
    led.close()  # c finished but never trained, d still running: both cancelled
    led.check()
    assert led.counts() == {"started": 4, "trained": 1, "dropped": {"tool_infra": 1, "cancelled": 2}}
    assert led.trained_order == ["task-1"]


def test_training_twice_or_unknown_reasons_are_refused():
    led = Ledger()
    led.start("a", 0)
    led.finish("a")
    led.train("a", "t")
    with pytest.raises(AssertionError, match="trained while trained"):
        led.train("a", "t")
    led.start("b", 0)
    with pytest.raises(AssertionError, match="unknown drop reason 'oops'"):
        led.drop("b", "oops")
    with pytest.raises(AssertionError, match="started twice"):
        led.start("b", 1)


def test_check_catches_a_trajectory_left_running():
    led = Ledger()
    led.start("a", 0)
    with pytest.raises(AssertionError, match=r"neither trained nor dropped with a reason: \['a'\]"):
        led.check()


def test_a_checkpoint_counts_its_steps_and_a_resumed_ledger_adds_them():
    led = Ledger()
    for rid, step in (("a", 0), ("b", 0), ("c", 1), ("d", 1), ("e", 2)):
        led.start(rid, step)
    for rid in ("a", "c"):
        led.finish(rid)
        led.train(rid, f"task-{rid}")
    led.drop("b", "stale")
    led.finish("d")  # of a checkpointed step but not trained (finish-order batching): lost at a stop
    at_ckpt = led.counts(before_step=2)  # "e" belongs to a step the resumed run runs again
    assert at_ckpt == {"started": 4, "trained": 2, "dropped": {"stale": 1, "cancelled": 1}}

    resumed = Ledger(prior=at_ckpt)
    resumed.start("e2", 2)
    resumed.finish("e2")
    resumed.train("e2", "task-e")
    resumed.close()
    resumed.check()
    total = resumed.counts()
    assert total == {"started": 5, "trained": 3, "dropped": {"stale": 1, "cancelled": 1}}
    assert total["started"] == total["trained"] + sum(total["dropped"].values())
