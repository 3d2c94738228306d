"""CallOnce: a keyed env call runs once however the calls interleave; every call gets the first run's outcome."""

import concurrent.futures as cf
import threading

from engine.runtime.once import CallOnce


def test_a_key_runs_once_and_every_caller_gets_its_outcome():
    once, runs, started, release = CallOnce(), [], threading.Event(), threading.Event()

    def slow():
        runs.append(1)
        started.set()
        release.wait(5)
        return True, "result"

    replies = []
    with cf.ThreadPoolExecutor(2) as pool:
        first = pool.submit(once.run, "r", (1, 0), slow, replies.append)
        started.wait(5)
        once.run("r", (1, 0), slow, replies.append)  # the request moved: its new instance re-issues the call
        assert replies == []  # answered when the first run ends, without holding this thread
        release.set()
        first.result(5)
    once.run("r", (1, 0), slow, replies.append)  # a late repeat: answered at once
    assert runs == [1] and replies == [(True, "result")] * 3


def test_keys_are_per_request_and_call_and_forgotten_with_the_episode():
    once, runs = CallOnce(), []

    def fn(tag):
        return lambda: runs.append(tag) or (True, tag)

    out = []
    for rid, key in [("a", (1, 0)), ("a", (1, 1)), ("b", (1, 0)), ("a", (1, 0))]:
        once.run(rid, key, fn((rid, key)), out.append)
    assert runs == [("a", (1, 0)), ("a", (1, 1)), ("b", (1, 0))] and out[-1] == (True, ("a", (1, 0)))
    once.run("a", (2, 0), fn(("a", (2, 0))), out.append)  # the next turn: the first one's outcomes go
    assert len(once) == 2
    once.run("a", (1, 0), fn("again"), out.append)
    assert runs[-1] == "again"
    once.forget("a")
    assert len(once) == 1
