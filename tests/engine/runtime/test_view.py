"""engine/runtime/view.py's health check: a silent rank is named once when it falls silent and once when
it is back; past the rank timeout the run stops with the rank named."""

import logging
import time

import pytest

from engine.runtime.view import StepView, step_text


class Beats:
    """last_beat_and_role as the store answers it: (wall time of the last beat, role)."""

    def __init__(self):
        self.beats: dict[int, tuple[float, str]] = {}

    def last_beat_and_role(self, rank):
        return self.beats.get(rank)


def check(view, beats, *, rank_timeout_s=60.0, straggler_s=5.0):
    view._last_health = 0.0  # the check runs at most once a second; these calls stand for seconds apart
    view.check_health(beats, 3, rank_timeout_s, now=0.0, straggler_s=straggler_s)


def test_a_silent_rank_is_named_once_and_again_when_it_is_back(caplog):
    view, beats, wall = StepView(), Beats(), time.time()
    beats.beats = {1: (wall, "trainer:0"), 2: (wall - 8.0, "rollout:1 (instance 0, short TP1)")}
    with caplog.at_level(logging.WARNING, logger="libra"):
        check(view, beats)
        check(view, beats)
        silent = [r.getMessage() for r in caplog.records]
        assert len(silent) == 1 and silent[0].startswith("[libra] rank 2 (rollout:1 (instance 0, short TP1)) sent no heartbeat for 8 s")
        assert view.silent().startswith("rank 2 (rollout:1 (instance 0, short TP1)) sent no heartbeat for 8 s: it is hung")
        beats.beats[2] = (time.time(), "rollout:1 (instance 0, short TP1)")
        check(view, beats)
        check(view, beats)
    assert view.silent() == ""
    back = [r.getMessage() for r in caplog.records][1:]
    assert len(back) == 1 and back[0].startswith("[libra] rank 2 (rollout:1 (instance 0, short TP1)) is back after 8 s")


def test_a_rank_silent_past_the_timeout_ends_the_run_named():
    view, beats = StepView(), Beats()
    beats.beats = {1: (time.time() - 90.0, "trainer:0"), 2: (time.time(), "rollout:1")}
    with pytest.raises(RuntimeError, match=r"rank 1 \(trainer:0\) sent no heartbeat for 90 s .*rank-timeout-s 60.*hung"):
        check(view, beats)


ROW = {"step": 3, "step_s": 0.0, "rollout_s": 2.0, "train_s": 0.5, "sync_s": 0.01, "reconfig_s": 0.0, "reward_mean": 0.5,
       "trajectories": 4, "tokens": 1000, "migrations": 2, "staleness_max": 1, "role_map_desc": "v1 train=2 | short:TP1x2"}


def test_the_step_line_rates_the_rollout_by_its_own_time_and_says_why_nothing_trained():
    line = step_text(ROW, 20, layout_changed=False)
    assert "rollout 2.0s 500 tok/s" in line  # 1000 tokens over the rollout's 2 s, not over 0.0 s of step wall time
    assert "layout" not in line and "trained nothing" not in line
    big = step_text({**ROW, "step": 120, "step_s": 312.4, "rollout_s": 301.2, "tokens": 214254, "trajectories": 128,
                     "migrations": 1031}, 200, layout_changed=False)
    assert len(big) <= 115, big  # fits a terminal's 120 columns
    assert step_text(ROW, 20, layout_changed=True).endswith("| layout v1 train=2 | short:TP1x2")
    assert "trained nothing: every group's rewards were equal (no signal)" in step_text(
        {**ROW, "train/stepped": 0}, 20, layout_changed=False)
    assert "trained nothing: a non-finite loss" in step_text(
        {**ROW, "train/stepped": 0, "train/nonfinite_skipped": 1}, 20, layout_changed=False)
