"""The planner's length sample (scheduler/layout_model.py): a finish-order batch is the first groups to
finish, so the trajectories still running are lower bounds the sample must not drop."""

from scheduler.api import StepStats
from scheduler.layout_model import Workload, uncensored


def test_without_censoring_the_sample_is_the_finished_lengths():
    assert uncensored((10, 30), (5, 6), ()) == ((10, 30), (5, 6))


def test_a_censored_length_becomes_the_median_finished_length_at_least_as_long():
    finished, signals = (100, 200, 300, 400, 500), (10, 20, 30, 40, 50)
    lengths, sig = uncensored(finished, signals, (250, 450, 900))
    # 250: 300, 400, 500 are at least as long, median 400; 450: 500; 900: none finished that long -> 900 itself
    assert lengths == finished + (400, 500, 900) and sig == signals + (40, 50, 900)
    assert uncensored(finished, (), (250,)) == (finished + (400,), ())  # no signals known: none made up


def test_a_finish_order_step_reports_its_running_trajectories_to_the_workload():
    short = StepStats(step=0, rollout_s=1, train_s=1, trajectory_tokens=(100, 120), censored_tokens=(900, 1500))
    wl = Workload.from_stats([short])
    assert wl.trajectory_tokens == (100, 120, 900, 1500)  # what the long ones have reached so far, at least
    assert wl.num_trajectories == 2  # the batch trained two: the running ones are not extra work per step
