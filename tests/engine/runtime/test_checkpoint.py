"""engine/runtime/checkpoint.py: `latest()` returns the newest complete checkpoint and ignores a run
killed mid-write; `save` then `load` gives back the same RunState; a failing trainer save leaves
no checkpoint that `latest()` would pick."""

import pytest

from engine.runtime import checkpoint
from scheduler.layout import BucketsConfig, split_role_map
from steps.commands import RunState


def state(step: int) -> RunState:
    rm = split_role_map(world_size=4, num_trainer=1, rollout_tp=(("short", 1), ("long", 2)),
                        buckets=BucketsConfig().buckets(), version=step)
    return RunState(step=step, policy_version=step, role_map=rm, prefix_tree='{"nodes": []}',
                    ledger={"trained": 8 * step, "stale": 1}, trained_task_ids=tuple(f"t{i}" for i in range(step)))


def write_trainer(d: str, what: str) -> None:
    (checkpoint.Path(d) / "trainer.pt").write_bytes(b"weights")


def test_save_then_load_gives_back_the_same_run_state(tmp_path):
    path = checkpoint.save(tmp_path, state(3), write_trainer)
    assert path.name == "step-000003" and (path / "trainer.pt").read_bytes() == b"weights"
    assert checkpoint.load(path) == state(3)


def test_latest_is_the_newest_complete_checkpoint(tmp_path):
    assert checkpoint.latest(tmp_path) is None
    checkpoint.save(tmp_path, state(2), write_trainer)
    checkpoint.save(tmp_path, state(4), write_trainer)
    (tmp_path / "ckpt" / "step-000006").mkdir()  # killed before the marker: never picked
    (tmp_path / "ckpt" / ".tmp-step-000008").mkdir()
    assert checkpoint.latest(tmp_path).name == "step-000004"


def test_a_trainer_that_fails_to_save_leaves_no_checkpoint(tmp_path):
    def broken(d, what):
        raise RuntimeError(f"timed out waiting for {what}")

    with pytest.raises(RuntimeError, match="checkpoint step-000005"):
        checkpoint.save(tmp_path, state(5), broken)
    assert checkpoint.latest(tmp_path) is None
    assert list((tmp_path / "ckpt").iterdir()) == []  # on a full disk, the failed write frees what it took


def test_a_checkpoint_whose_file_lost_its_tail_is_skipped(tmp_path, caplog):
    checkpoint.save(tmp_path, state(2), write_trainer)
    newest = checkpoint.save(tmp_path, state(4), write_trainer)
    (newest / "trainer.pt").write_bytes(b"wei")
    assert checkpoint.latest(tmp_path).name == "step-000002"
    assert "step-000004 is torn (trainer.pt is 3 of 7 bytes)" in caplog.text


def test_saving_the_same_step_again_replaces_it(tmp_path):
    checkpoint.save(tmp_path, state(2), write_trainer)
    checkpoint.save(tmp_path, RunState(**{**state(2).__dict__, "policy_version": 9}), write_trainer)
    assert checkpoint.load(checkpoint.latest(tmp_path)).policy_version == 9


def test_only_the_newest_complete_checkpoints_are_kept(tmp_path):
    (tmp_path / "ckpt" / ".tmp-step-000001").mkdir(parents=True)  # torn by an earlier kill
    for step in (2, 4, 6):
        checkpoint.save(tmp_path, state(step), write_trainer, keep=2)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-000004", "step-000006"]
    checkpoint.save(tmp_path, state(8), write_trainer, keep=0)  # 0 keeps them all
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-000004", "step-000006", "step-000008"]
