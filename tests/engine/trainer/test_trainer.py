"""engine/trainer/trainer.py in one process: config errors, the plan, advantages, step semantics, checkpoints."""

import math

import pytest
import torch

from engine.models import build_tiny
from engine.trainer.trainer import Trainer, TrainerConfig, load_handoff, plan_micro_batches, save_handoff, trajectory_advantages
from engine.trajectory import Trajectory
from trainer_helpers import make_trajs





def params(trainer):
    return {k: v.clone() for k, v in trainer.full_state_dict().items()}


def tiny_trainer(**kw):
    model, _ = build_tiny(0)
    return Trainer(model, TrainerConfig(**{"lr": 1e-2, **kw}))


# ---- config --------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, msg", [
    ({"lr": 0.0}, r"lr=0.0 must be a finite number in \(0, 1\]; use e.g. 1e-6..1e-4"),
    ({"lr": float("inf")}, r"lr=inf must be a finite number in \(0, 1\]"),
    ({"lr": 1e9}, r"lr=1000000000.0 must be a finite number in \(0, 1\]"),
    ({"lr": float("nan")}, r"lr=nan must be a finite number in \(0, 1\]"),
    ({"weight_decay": -0.1}, r"weight_decay=-0.1 must be >= 0; use 0.0 to disable it"),
    ({"betas": (0.9, 1.0)}, r"betas=\(0.9, 1.0\) must be two values in \[0, 1\); use \(0.9, 0.999\)"),
    ({"adam_eps": 0.0}, r"adam_eps=0.0 must be > 0; use 1e-8"),
    ({"grad_clip": 0.0}, r"grad_clip=0.0 must be > 0; use float\('inf'\) to measure without clipping"),
    ({"clip_low": 1.0}, r"clip_low=1.0, clip_high=0.2 need 0 <= clip_low < 1 and clip_high >= 0"),
    ({"clip_high": -0.1}, r"clip_low=0.2, clip_high=-0.1 need 0 <= clip_low < 1 and clip_high >= 0"),
    ({"kl_coef": -1.0}, r"kl_coef=-1.0 must be >= 0; use 0.0 to train without a reference model"),
    ({"kl_kind": "k9"}, r"kl_kind='k9' is unknown; use one of \('k1', 'k2', 'k3'\)"),
    ({"aggregation": "sum"}, r"aggregation='sum' is unknown; use one of \('token-mean', 'seq-mean-token-mean'\)"),
    ({"micro_batch_tokens": 1}, r"micro_batch_tokens=1 must be >= 2; use a few thousand"),
    ({"off_policy": "stale"}, r"off_policy='stale' is unknown; use one of \('decoupled', 'bypass', 'recompute', 'recompute-all'\)"),
    ({"behaviour_weight_cap": 1.0}, r"behaviour_weight_cap=1.0 must be > 1; use 5.0, or inf to keep every token"),
    ({"clip_ratio_c": 0.5}, r"clip_ratio_c=0.5 must be > 1; use 3.0, or inf to turn dual-clip off"),
    ({"max_nonfinite_steps": 0}, r"max_nonfinite_steps=0 must be >= 1; use 3"),
    ({"max_tokens": -1}, r"max_tokens=-1 must be >= 0; pass the rollout's max_total_tokens, or 0 for no cut"),
    ({"max_staleness": -1}, r"max_staleness=-1 must be >= 0; use 0 for on-policy or 1 for one-step async"),
    ({"temperature": 0.0}, r"temperature=0.0 must be > 0; pass the rollout's sampling temperature"),
    ({"logprob_chunk_tokens": -1}, r"logprob_chunk_tokens=-1 must be >= 0; use ~512, or 0 for whole logits"),
    ({"activation_checkpointing": "yes"}, r"activation_checkpointing='yes' is unknown; use one of \('auto', 'on', 'off'\)"),
])
def test_config_errors_name_value_and_fix(kw, msg):
    with pytest.raises(ValueError, match=msg):
        TrainerConfig(**kw)


# ---- plan and advantages -------------------------------------------------------------------

def test_plan_balances_tokens_and_packs_by_padded_budget():
    lengths = [10, 3, 8, 8, 2, 5]
    # longest first to the least-loaded rank: 10->r0, 8->r1, 8->r1 (8<10), 5->r0, 3->r0 (15<16)?
    plan = plan_micro_batches(lengths, 2, micro_batch_tokens=16)
    assert plan == [[[0], [5, 1]], [[2, 3], [4]]]
    assert sorted(i for rank in plan for micro in rank for i in micro) == list(range(6))
    assert plan_micro_batches(lengths, 1, 100) == [[[0, 2, 3, 5, 1, 4]]]
    # a sequence longer than the budget still gets its own micro-batch; a rank may get nothing
    assert plan_micro_batches([50], 2, 16) == [[[0]], []]


def test_packed_plan_counts_the_sum_of_lengths_not_sequences_times_longest():
    lengths = [10, 3, 8, 8, 2, 5]
    # one rank, budget 16: padded, 10 then 8+8 (2 x 8) then 5+3+2 (3 x 5); packed, 10+5 fits where 10+8 does not
    assert plan_micro_batches(lengths, 1, 16) == [[[0], [2, 3], [5, 1, 4]]]
    assert plan_micro_batches(lengths, 1, 16, packed=True) == [[[0], [2, 3], [5, 1, 4]]]
    assert plan_micro_batches([10, 5, 1], 1, 16, packed=True) == [[[0, 1, 2]]]
    assert plan_micro_batches([10, 5, 1], 1, 16) == [[[0], [1, 2]]]
    plan = plan_micro_batches(lengths, 2, 16, packed=True)
    assert sorted(i for rank in plan for micro in rank for i in micro) == list(range(6))
    assert all(sum(lengths[i] for i in micro) <= 16 for rank in plan for micro in rank)


def test_advantages_per_group_with_uneven_groups():
    trajs = make_trajs(rewards=[1.0, 0.0, 1.0, 0.0, 2.0, 2.0, 2.0, 2.0])
    trajs = trajs[:3] + trajs[4:]  # group g0 lost one member
    adv = trajectory_advantages(trajs, normalize_std=False, eps=1e-6)
    assert adv == pytest.approx([1 / 3, -2 / 3, 1 / 3, 0.0, 0.0, 0.0, 0.0])
    trajs[0].reward = None
    with pytest.raises(ValueError, match=r"trajectory r0 has reward=None; score \(or drop\) it before training"):
        trajectory_advantages(trajs, normalize_std=True, eps=1e-6)


# ---- step semantics ------------------------------------------------------------------------

def test_zero_advantage_step_changes_nothing_even_with_weight_decay():
    trainer = tiny_trainer(weight_decay=0.1)
    before = params(trainer)
    metrics = trainer.train_step(make_trajs(rewards=[0.5] * 8), 0)
    after = params(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert metrics["train/stepped"] == 0.0 and metrics["train/loss"] == 0.0
    assert metrics["train/micro_batches"] == 0.0  # a zero gradient needs no forward or backward
    assert trainer.policy_version == 1


def test_step_changes_parameters_and_reports_metrics():
    trainer = tiny_trainer()
    before = params(trainer)
    trajs = make_trajs()
    metrics = trainer.train_step(trajs, 0)
    after = params(trainer)
    assert sum(not torch.equal(before[k], after[k]) for k in before) >= len(before) - 1
    assert metrics["train/stepped"] == 1.0 and trainer.policy_version == 1
    assert metrics["train/tokens"] == sum(t.num_tokens for t in trajs)
    assert metrics["train/model_tokens"] == sum(t.num_model_tokens for t in trajs)
    assert metrics["train/trajectories"] == 8.0 and metrics["train/reward_mean"] == 0.5
    assert math.isfinite(metrics["train/loss"]) and metrics["train/grad_norm"] > 0


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_micro_batching_does_not_change_the_update(aggregation):
    trajs = make_trajs(seed=3)
    trajs[5].loss_mask = [0] * trajs[5].num_tokens  # a sequence without model tokens must not dilute
    results = []
    for budget in (4096, 24):
        # A large Adam eps makes the first update linear in the gradient instead of ~sign(grad),
        # which would turn float-order noise on near-zero gradients into lr-sized differences.
        trainer = tiny_trainer(micro_batch_tokens=budget, adam_eps=1.0, aggregation=aggregation)
        metrics = trainer.train_step(trajs, 0)
        results.append((metrics, params(trainer)))
    (m_big, p_big), (m_small, p_small) = results
    assert m_big["train/micro_batches"] == 1.0 and m_small["train/micro_batches"] > 3
    assert m_small["train/loss"] == pytest.approx(m_big["train/loss"], abs=1e-6)
    assert all(torch.allclose(p_big[k], p_small[k], atol=1e-6) for k in p_big)


def test_packed_rows_give_the_padded_rows_log_probs():
    from engine.trainer.batch import collate, policy_logprobs

    model, _ = build_tiny(0)
    trajs = make_trajs(seed=5)
    padded = collate(trajs, [0.0] * len(trajs), "cpu")
    packed = collate(trajs, [0.0] * len(trajs), "cpu", packed=True)
    assert packed["packed_ids"].shape == (1, sum(t.num_tokens - 1 for t in trajs))
    with torch.no_grad():
        want = policy_logprobs(model, padded, temperature=1.0, chunk_tokens=0)
        got = policy_logprobs(model, packed, temperature=1.0, chunk_tokens=5)
    valid = packed["target_valid"] > 0
    assert valid.sum() == packed["packed_ids"].numel()
    assert torch.allclose(got[valid], want[valid], atol=1e-5) and (got[~valid] == 0).all()


@pytest.mark.parametrize("switches", [
    {"pack_sequences": True}, {"logprob_chunk_tokens": 7}, {"activation_checkpointing": "on"},
    {"pack_sequences": True, "logprob_chunk_tokens": 7, "activation_checkpointing": "on", "kl_coef": 0.1},
])
def test_memory_switches_do_not_change_the_update(switches):
    trajs = make_trajs(seed=3)
    base = {"pack_sequences": False, "logprob_chunk_tokens": 0, "activation_checkpointing": "off",
            "micro_batch_tokens": 40, "adam_eps": 1.0, "kl_coef": switches.get("kl_coef", 0.0)}
    results = []
    for kw in (base, {**base, **switches}):
        trainer = tiny_trainer(**kw)
        results.append((trainer.train_step(trajs, 0), params(trainer), trainer.activation_checkpointing))
    (m_ref, p_ref, _), (m, p, ac) = results
    assert ac == (switches.get("activation_checkpointing") == "on")
    for key in ("train/loss", "train/kl", "train/clip_frac"):
        assert m[key] == pytest.approx(m_ref[key], abs=1e-6), key
    assert all(torch.allclose(p_ref[k], p[k], atol=1e-6) for k in p_ref)
    assert m["train/micro_batches"] < len(trajs)  # so packed rows hold several sequences


def test_fresh_tokens_use_their_recorded_logprobs_in_every_objective_but_recompute_all():
    # behaviour log-probs of -6 are far from the tiny model's (~ -6.2): ratios differ from 1
    on_policy = make_trajs(version=0)
    ref = tiny_trainer(off_policy="bypass").train_step(on_policy, 0)
    assert ref["train/ratio_mean"] != pytest.approx(1.0, abs=1e-3) and ref["train/stale_tokens"] == 0.0
    for mode in ("decoupled", "recompute"):
        m = tiny_trainer(off_policy=mode).train_step(on_policy, 0)
        assert m["train/pg_loss"] == pytest.approx(ref["train/pg_loss"], abs=1e-7), mode
    every = tiny_trainer(off_policy="recompute-all").train_step(on_policy, 0)
    assert every["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6) and every["train/clip_frac"] == 0.0
    assert every["train/tokens_at_lag/0"] == sum(t.num_model_tokens for t in on_policy)


def _current_logprobs(trainer, traj):
    """The trainer policy's log-prob of each of traj's tokens (position 0: none), by a plain forward."""
    from engine.trainer.batch import collate

    with torch.no_grad():
        lp = trainer._logprobs(trainer.model, collate([traj], [0.0], trainer.device, packed=False))[0]
    return [0.0] + lp[: traj.num_tokens - 1].tolist()


def _stale_batch(trainer, weights):
    """One version-0 group of 4 (rewards 1, 0, 1, 0) whose model tokens' recorded log-probs make the
    behaviour weight pi_current / pi_behave of sequence i exactly weights[i]."""
    trajs = make_trajs(num_groups=1, n=4, seed=3, version=0)
    for t, w in zip(trajs, weights):
        current = _current_logprobs(trainer, t)
        t.logprobs = [lp - math.log(w) if m else 0.0 for lp, m in zip(current, t.loss_mask)]
    return trajs


def _expected_pg_loss(trajs, weights, per_token):
    advantages = trajectory_advantages(trajs, normalize_std=True, eps=1e-6)
    tokens = [(a, w) for t, a, w in zip(trajs, advantages, weights) for m in t.loss_mask[1:] if m]
    return sum(per_token(a, w) for a, w in tokens) / len(tokens)


def test_decoupled_objective_weights_stale_tokens_by_pi_prox_over_pi_behave():
    trainer = tiny_trainer(off_policy="decoupled", behaviour_weight_cap=5.0)
    trainer.policy_version = 1  # the batch is one version old
    weights = [2.0, 0.5, 10.0, 1.25]  # 10 is over the cap of 5: masked, but still counted in the denominator
    trajs = _stale_batch(trainer, weights)
    m = trainer.train_step(trajs, 1)
    # ratio to the proximal (current) policy is 1: per-token loss -A * w, or 0 where capped
    want = _expected_pg_loss(trajs, weights, lambda a, w: 0.0 if w > 5.0 else -a * w)
    assert m["train/pg_loss"] == pytest.approx(want, abs=1e-5)
    n = [sum(t.loss_mask[1:]) for t in trajs]
    assert m["train/stale_tokens"] == sum(n) and m["train/tokens_at_lag/1"] == sum(n)
    assert m["train/behaviour_weight_max"] == pytest.approx(10.0, rel=1e-4)
    assert m["train/behaviour_weight_mean"] == pytest.approx(sum(w * k for w, k in zip(weights, n)) / sum(n), rel=1e-4)
    assert m["train/behaviour_capped_frac"] == pytest.approx(n[2] / sum(n))
    assert m["train/clip_frac"] == 0.0 and m["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)


def test_bypass_clips_stale_tokens_against_their_recorded_logprobs_and_recompute_does_not():
    weights = [2.0, 0.5, 10.0, 1.1]

    def ppo(a, r, c=3.0):  # the PPO-clip token loss with dual-clip, written out
        loss = max(-a * r, -a * min(max(r, 0.8), 1.2))
        return min(loss, -a * c) if a < 0 else loss

    for mode, per_token in (("bypass", ppo), ("recompute", lambda a, w: -a)):
        trainer = tiny_trainer(off_policy=mode)
        trainer.policy_version = 1
        trajs = _stale_batch(trainer, weights)
        m = trainer.train_step(trajs, 1)
        assert m["train/pg_loss"] == pytest.approx(_expected_pg_loss(trajs, weights, per_token), abs=1e-5), mode
        assert m["train/behaviour_capped_frac"] == 0.0  # only the decoupled objective masks


def test_stale_tokens_are_bounded():
    trainer = tiny_trainer(max_staleness=1)
    trainer.train_step(make_trajs(version=0), 0)
    mixed = make_trajs(version=0, seed=1)
    for t in mixed[:4]:  # half the batch comes from the current version 1
        t.versions = [v if v < 0 else 1 for v in t.versions]
    metrics = trainer.train_step(mixed, 1)
    assert metrics["train/stale_tokens"] == sum(t.num_model_tokens for t in mixed[4:]) == metrics["train/tokens_at_lag/1"]
    assert metrics["train/tokens_at_lag/0"] == sum(t.num_model_tokens for t in mixed[:4])
    assert metrics["train/staleness_max"] == 1.0
    with pytest.raises(ValueError, match=r"trajectory r0 has staleness 2 > max_staleness=1; drop it as stale"):
        trainer.train_step(make_trajs(version=0), 2)
    admitted = tiny_trainer(max_staleness=None)  # bounded at admission: any lag trains
    admitted.policy_version = 2
    assert admitted.train_step(make_trajs(version=0), 2)["train/staleness_max"] == 2.0


@pytest.mark.parametrize("reward", [0.1, 0.7, 1 / 3])
def test_equal_rewards_that_float32_cannot_hold_train_nothing(reward):
    trainer = tiny_trainer(weight_decay=0.1)
    before = params(trainer)
    m = trainer.train_step(make_trajs(num_groups=1, n=8, rewards=[reward] * 8), 0)
    assert m["train/stepped"] == 0.0 and m["train/adv_abs_mean"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in params(trainer).items())


def test_a_nan_skips_the_step_and_a_run_of_them_stops_the_run():
    trainer = tiny_trainer(max_nonfinite_steps=2)
    before = params(trainer)
    poisoned = make_trajs(version=0)
    poisoned[5].logprobs[-1] = float("nan")  # one recorded log-prob of one trajectory
    m = trainer.train_step(poisoned, 0)
    assert m["train/nonfinite_skipped"] == 1.0 and m["train/stepped"] == 0.0 and not math.isfinite(m["train/loss"])
    assert all(torch.equal(before[k], v) for k, v in params(trainer).items())
    assert trainer.optimizer.state == {} or all(s["step"] == 0 for s in trainer.optimizer.state.values())
    clean = trainer.train_step(make_trajs(version=1), 1)  # a finite step resets the count
    assert clean["train/nonfinite_skipped"] == 0.0 and clean["train/stepped"] == 1.0
    clamped = make_trajs(version=2)
    clamped[0].logprobs[-1] = float("inf")  # an infinite log-ratio is clamped at 20, not a NaN
    assert trainer.train_step(clamped, 2)["train/stepped"] == 1.0
    poisoned = make_trajs(version=3, rewards=[float("nan")] + [0.0, 1.0] * 3 + [1.0])  # a NaN reward
    assert trainer.train_step(poisoned, 3)["train/nonfinite_skipped"] == 1.0
    poisoned = make_trajs(version=4)
    poisoned[0].logprobs[-1] = float("nan")
    after_clean = params(trainer)
    with pytest.raises(RuntimeError, match=r"2 steps in a row had a NaN/inf loss or gradient \(last at policy_version 4\); "
                                           r"none was applied.*Lower --trainer.lr"):
        trainer.train_step(poisoned, 4)
    assert all(torch.equal(after_clean[k], v) for k, v in params(trainer).items())


def test_step_refuses_wrong_version_and_empty_batch():
    trainer = tiny_trainer()
    with pytest.raises(ValueError, match=r"train_step\(policy_version=3\) but the trainer holds version 0; pass trainer.policy_version"):
        trainer.train_step(make_trajs(), 3)
    with pytest.raises(ValueError, match=r"trajectory r0 has tokens of version 2 > trainer version 0"):
        trainer.train_step(make_trajs(version=2), 0)
    with pytest.raises(ValueError, match=r"train_step got no trajectories; skip the step"):
        trainer.train_step([], 0)


def test_kl_to_reference_is_zero_first_then_positive():
    trainer = tiny_trainer(kl_coef=0.5)
    first = trainer.train_step(make_trajs(), 0)
    assert first["train/kl"] == pytest.approx(0.0, abs=1e-9)
    second = trainer.train_step(make_trajs(seed=1), 1)
    assert second["train/kl"] > 0.0


# ---- weights and checkpoints ----------------------------------------------------------------

def test_full_state_dict_names_match_the_model():
    model, _ = build_tiny(0)
    names = list(model.state_dict())
    assert list(Trainer(model, TrainerConfig()).full_state_dict()) == names


def test_checkpoint_round_trip_resumes_identically():
    a = tiny_trainer()
    a.train_step(make_trajs(seed=0), 0)
    state = a.state_dict()
    b = tiny_trainer()
    b.load_state_dict(state)
    assert b.policy_version == 1
    a.train_step(make_trajs(seed=1), 1)
    b.train_step(make_trajs(seed=1), 1)
    pa, pb = params(a), params(b)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def test_a_hand_off_through_a_file_resumes_identically(tmp_path):
    # what a role switch does: the old trainer saves, a freshly built one loads (engine.runtime.worker uses these)
    a = tiny_trainer()
    a.train_step(make_trajs(seed=0), 0)
    save_handoff(a, tmp_path / "v1", write=True)
    b = tiny_trainer()
    load_handoff(b, tmp_path / "v1", "cpu")
    assert b.policy_version == 1 and sorted(p.name for p in (tmp_path / "v1").iterdir()) == ["trainer.pt"]
    a.train_step(make_trajs(seed=1), 1)
    b.train_step(make_trajs(seed=1), 1)
    pa, pb = params(a), params(b)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    save_handoff(a, tmp_path / "v2", write=False)  # a rank that does not write takes part and leaves no file
    assert not (tmp_path / "v2").exists()


# ---- the whole step by hand -------------------------------------------------------------------

class BiasLM(torch.nn.Module):
    """A hand-checkable policy: the same learnable logits over a 2-token vocabulary everywhere."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.zeros(2))

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        return type("Out", (), {"logits": self.table.expand(*input_ids.shape, 2)})()


def test_one_step_by_hand():
    # group rewards [1, 0] -> advantages +-0.5 / std([1, 0]) = +-1/sqrt(2); every ratio is 1.
    # d logp(1)/d table = [-1/2, 1/2], d logp(0)/d table = [1/2, -1/2]; token-mean over 4 tokens:
    # grad = (-a * 2 * [-1/2, 1/2] + a * 2 * [1/2, -1/2]) / 4 = [a/2, -a/2], norm 1/2.
    half = math.log(0.5)
    trajs = [Trajectory(request_id=f"r{i}", task_id="t", group_id="g", prompt_len=1, token_ids=[0, tok, tok],
                        loss_mask=[0, 1, 1], logprobs=[0.0, half, half], versions=[-1, 0, 0], reward=1.0 - i)
             for i, tok in enumerate((1, 0))]
    model = BiasLM()  # no output layer to chunk, no position ids to pack with
    metrics = Trainer(model, TrainerConfig(lr=0.1, grad_clip=10.0, logprob_chunk_tokens=0, pack_sequences=False)).train_step(trajs, 0)
    assert metrics["train/loss"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["train/grad_norm"] == pytest.approx(0.5, abs=1e-6)
    assert metrics["train/adv_abs_mean"] == pytest.approx(1 / math.sqrt(2), abs=1e-5)
    # Adam's first step moves each weight by lr * sign(grad): the rewarded token 1 goes up.
    assert model.table.tolist() == pytest.approx([-0.1, 0.1], abs=1e-6)


def test_a_trajectory_over_max_tokens_is_cut_before_training_and_counted():
    trajs = make_trajs(seed=4)
    long = max(trajs, key=lambda t: t.num_tokens)
    cap = long.num_tokens - 3
    over = sum(t.num_tokens > cap for t in trajs)
    cut = tiny_trainer(max_tokens=cap).train_step(trajs, 0)
    assert cut["train/truncated_trajectories"] == over >= 1
    assert cut["train/tokens"] == sum(min(t.num_tokens, cap) for t in trajs)
    assert long.num_tokens == cap + 3  # the caller's trajectory is not changed
    # the same step on trajectories cut by hand: identical update
    ref = tiny_trainer().train_step([t.truncated(cap) for t in trajs], 0)
    assert ref["train/truncated_trajectories"] == 0.0 and ref["train/loss"] == pytest.approx(cut["train/loss"], abs=1e-7)
