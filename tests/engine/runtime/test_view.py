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
    assert "layout" not in line and "skipped" not in line
    big_row = {**ROW, "step": 120, "step_s": 312.4, "rollout_s": 301.2, "tokens": 214254, "trajectories": 128,
               "migrations": 1031}
    big = step_text(big_row, 200, layout_changed=False)
    assert len(big) <= 115, big  # fits a terminal's 120 columns
    assert step_text(ROW, 20, layout_changed=True).endswith("| layout v1 train=2 | short:TP1x2")
    skipped = step_text({**big_row, "train/stepped": 0, "sync_s": 0.0}, 200, layout_changed=False)
    assert "| train skipped: no signal | reward" in skipped and len(skipped) <= 120, skipped
    assert "train skipped: non-finite loss" in step_text(
        {**ROW, "train/stepped": 0, "train/nonfinite_skipped": 1}, 20, layout_changed=False)


def test_a_skipped_step_is_explained_in_full_the_first_time(caplog):
    view = StepView(console=None)
    with caplog.at_level(logging.INFO, logger="libra"):
        for step in (1, 2):
            view.step_line({**ROW, "step": step, "train/stepped": 0}, 20)
    lines = [r.getMessage() for r in caplog.records]
    assert "(train skipped: no signal: every group's rewards were equal, so every GRPO advantage was 0)" in lines[0]
    assert "advantage" not in lines[1]


def test_log_lines_print_above_the_live_panel_and_nothing_of_it_stays():
    """On a terminal the panel redirects stdout/stderr; a log handler made before it wrote past the redirect,
    and the panel's next refresh drew over the line (the planner's decisions never showed)."""
    import io
    import sys

    from rich.console import Console

    screen, original = io.StringIO(), sys.stderr
    handler = logging.StreamHandler(original)
    logging.getLogger("libra").addHandler(handler)
    try:
        view = StepView(console=Console(file=screen, force_terminal=True, width=120))
        assert handler.stream is sys.stderr and sys.stderr is not original  # onto the panel's redirect
        logging.getLogger("libra").warning("planner: a decision")
        view.step_line({"step": 1, "step_s": 1.0, "rollout_s": 1.0, "tokens": 10, "train_s": 0.5, "sync_s": 0.0,
                        "reconfig_s": 0.0, "reward_mean": 0.5, "trajectories": 4, "migrations": 0,
                        "staleness_max": 0, "role_map_desc": "v0 train=1"}, 3)
        view.close()
        assert handler.stream is original and sys.stderr is original  # straight out again
    finally:
        logging.getLogger("libra").removeHandler(handler)
    text = screen.getvalue()
    assert "planner: a decision" in text and "step 1/3" in text
    assert text.index("planner: a decision") < text.index("step 1/3")


def test_on_a_terminal_a_worker_sends_its_log_lines_to_rank_0_and_gets_its_handler_back():
    """Another process's line written to the terminal under rank 0's panel was erased by the panel's next refresh."""
    import io

    from engine.runtime.view import ToCoordinator

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term, piped = Terminal(), io.StringIO()
    on_term, on_pipe = logging.StreamHandler(term), logging.StreamHandler(piped)
    on_term.setFormatter(logging.Formatter("[rank 2] %(message)s"))
    root = logging.getLogger()
    root.addHandler(on_term)
    root.addHandler(on_pipe)
    sent = []
    try:
        swapped = ToCoordinator.install(sent.append)
        assert [h for h, _ in swapped] == [on_term] and on_term not in root.handlers and on_pipe in root.handlers
        logging.getLogger("libra").warning("2 trajectories cut")
        assert sent == ["[rank 2] 2 trajectories cut"] and term.getvalue() == ""  # rank 0 prints it
        ToCoordinator.restore(swapped)
        assert on_term in root.handlers and not any(isinstance(h, ToCoordinator) for h in root.handlers)
    finally:
        root.removeHandler(on_term)
        root.removeHandler(on_pipe)
    view, out = StepView(console=None), io.StringIO()  # no terminal: the line goes to stderr as it came
    import contextlib
    with contextlib.redirect_stderr(out):
        view.print_line("[rank 2] 2 trajectories cut")
    assert out.getvalue() == "[rank 2] 2 trajectories cut\n"
