"""engine/trainer/algos.py on tiny tensors with hand-computed expected values."""

import math

import pytest
import torch

from engine.trainer.algos import chunked_token_logprobs, group_advantages, kl_penalty, masked_aggregate, ppo_clip_loss, token_logprobs


def close(a, b, tol=1e-6):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32), atol=tol, rtol=0)


# ---- advantages ----------------------------------------------------------------------------


def test_group_advantages_normalised_by_unbiased_std():
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [3.0, 1.0, 2.0, 2.0]])
    adv = group_advantages(rewards, eps=0.0)
    # group 0: mean .5, std sqrt(1/3); group 1: mean 2, std sqrt(2/3)
    s = 0.5 / math.sqrt(1 / 3)
    t = 1.0 / math.sqrt(2 / 3)
    assert close(adv, [[s, -s, s, -s], [t, -t, 0.0, 0.0]])


def test_group_advantages_without_std():
    adv = group_advantages(torch.tensor([[1.0, 0.0, 1.0, 0.0], [4.0, 2.0, 0.0, 2.0]]), normalize_std=False)
    assert close(adv, [[0.5, -0.5, 0.5, -0.5], [2.0, 0.0, -2.0, 0.0]])


def test_equal_rewards_and_singleton_groups_give_zero_not_nan():
    adv = group_advantages(torch.tensor([[0.7, 0.7, 0.7], [0.0, 0.0, 0.0]]))
    assert torch.equal(adv, torch.zeros(2, 3))
    single = group_advantages(torch.tensor([[5.0], [1.0]]))
    assert torch.equal(single, torch.zeros(2, 1))


@pytest.mark.parametrize("reward", [0.1, 0.7, 1 / 3, 1.0, 0.5, -2.3])
@pytest.mark.parametrize("normalize_std", [True, False])
def test_equal_rewards_that_float32_cannot_hold_give_exactly_zero(reward, normalize_std):
    # float32 means of 8 x 0.7 are off by an ulp; divided by a std of ~1e-8 + eps that was +-0.056
    rewards = torch.full((1, 8), reward, dtype=torch.float32)
    assert torch.equal(group_advantages(rewards, normalize_std=normalize_std), torch.zeros(1, 8))
    # rewards equal only to rounding (one ulp off) are equal too; a real difference is not
    nearly = rewards.clone()
    nearly[0, 3] = torch.nextafter(nearly[0, 3], torch.tensor(10.0))
    assert torch.equal(group_advantages(nearly, normalize_std=normalize_std), torch.zeros(1, 8))
    apart = rewards.clone()
    apart[0, 0] += 0.01
    assert group_advantages(apart, normalize_std=normalize_std)[0, 0] > 0


def test_group_advantages_rejects_flat_rewards():
    with pytest.raises(ValueError, match=r"rewards has shape \(4,\), expected \[num_groups, n\]; reshape"):
        group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]))


# ---- log-probs -----------------------------------------------------------------------------


def test_token_logprobs_exact():
    logits = torch.tensor([[[0.0, math.log(3.0)], [math.log(2.0), 0.0]]])  # [1, 2, 2]
    lp = token_logprobs(logits, torch.tensor([[1, 1]]))
    assert close(lp, [[math.log(0.75), math.log(1 / 3)]])
    hot = token_logprobs(logits, torch.tensor([[1, 0]]), temperature=2.0)
    r3, r2 = math.sqrt(3.0), math.sqrt(2.0)
    assert close(hot, [[math.log(r3 / (1 + r3)), math.log(r2 / (1 + r2))]])


def test_token_logprobs_is_float32_for_half_logits():
    logits = torch.zeros(1, 3, 4, dtype=torch.bfloat16)
    lp = token_logprobs(logits, torch.tensor([[0, 1, 3]]))
    assert lp.dtype == torch.float32 and close(lp, torch.full((1, 3), math.log(0.25)))


@pytest.mark.parametrize("chunk_tokens", [1, 4, 7, 15, 100])
@pytest.mark.parametrize("with_bias", [False, True])
def test_chunked_logprobs_equal_whole_logits_in_value_and_gradient(chunk_tokens, with_bias):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 5, 8, generator=gen, requires_grad=True)
    weight = torch.randn(11, 8, generator=gen, requires_grad=True)
    bias = torch.randn(11, generator=gen, requires_grad=True) if with_bias else None
    targets = torch.randint(0, 11, (3, 5), generator=gen)
    upstream = torch.randn(3, 5, generator=gen)
    whole = token_logprobs(torch.nn.functional.linear(hidden, weight, bias), targets, temperature=0.7)
    grads_whole = torch.autograd.grad((whole * upstream).sum(), [hidden, weight] + ([bias] if with_bias else []))
    chunked = chunked_token_logprobs(hidden, weight, targets, temperature=0.7, chunk_tokens=chunk_tokens, bias=bias)
    grads_chunked = torch.autograd.grad((chunked * upstream).sum(), [hidden, weight] + ([bias] if with_bias else []))
    assert chunked.shape == (3, 5) and chunked.dtype == torch.float32
    assert torch.allclose(chunked, whole, atol=1e-6)
    for a, b in zip(grads_chunked, grads_whole):
        assert torch.allclose(a, b, atol=1e-5)


def test_chunked_logprobs_keep_no_full_vocabulary_tensor_for_backward():
    """What autograd saves outside the checkpointed chunks: never a [tokens, vocab] tensor."""
    vocab, tokens, chunk = 1000, 64, 8
    hidden = torch.randn(1, tokens, 16, requires_grad=True)
    weight = torch.randn(vocab, 16, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp = chunked_token_logprobs(hidden, weight, torch.zeros(1, tokens, dtype=torch.long), chunk_tokens=chunk)
    lp.sum().backward()
    assert weight.grad is not None and hidden.grad.abs().sum() > 0
    assert not any(shape[-1:] == (vocab,) and math.prod(shape) > chunk * vocab for shape in saved), saved
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):  # and the whole-logits path does keep one
        token_logprobs(torch.nn.functional.linear(hidden, weight), torch.zeros(1, tokens, dtype=torch.long))
    assert any(shape[-1:] == (vocab,) and math.prod(shape) >= tokens * vocab for shape in saved)


def test_chunked_logprobs_refuse_a_chunk_of_zero():
    with pytest.raises(ValueError, match=r"chunk_tokens=0 must be >= 1; use ~512"):
        chunked_token_logprobs(torch.zeros(1, 2, 4), torch.zeros(3, 4), torch.zeros(1, 2, dtype=torch.long), chunk_tokens=0)


# ---- PPO clip --------------------------------------------------------------------------------

# seq 0 (A=+1) ratios 1.5, 0.5; seq 1 (A=-1) ratios 1.1, 0.7; clip 0.2:
# per-token loss  [-1.2 (clipped), -0.5], [1.1, 0.8 (clipped)]
RATIOS = torch.tensor([[1.5, 0.5], [1.1, 0.7]])
ADV = torch.tensor([1.0, -1.0])


def _loss(mask, **kw):
    lp = torch.log(RATIOS).clone().requires_grad_(True)
    loss, metrics = ppo_clip_loss(lp, torch.zeros(2, 2), ADV, mask, **kw)
    return lp, loss, metrics


def test_ppo_clip_token_mean_values_and_gradient():
    lp, loss, metrics = _loss(torch.ones(2, 2))
    assert close(loss, 0.2 / 4)
    assert close(metrics["clip_frac"], 0.5)
    assert close(metrics["ratio_mean"], (1.5 + 0.5 + 1.1 + 0.7) / 4)
    assert close(metrics["approx_kl"], -torch.log(RATIOS).mean())
    loss.backward()
    # d/dlogp of -A*ratio is -A*ratio; clipped tokens have zero gradient.
    assert close(lp.grad, [[0.0, -0.5 / 4], [1.1 / 4, 0.0]])


def test_ppo_clip_masked_token_mean_and_seq_mean():
    mask = torch.tensor([[1, 1], [1, 0]])
    _, loss, metrics = _loss(mask)
    assert close(loss, (-1.2 - 0.5 + 1.1) / 3)
    assert close(metrics["clip_frac"], 1 / 3)
    _, seq_loss, _ = _loss(mask, aggregation="seq-mean-token-mean")
    assert close(seq_loss, ((-1.2 - 0.5) / 2 + 1.1) / 2)


def test_ppo_clip_asymmetric_clip_higher():
    _, loss, _ = _loss(torch.ones(2, 2), clip_low=0.2, clip_high=0.28)
    assert close(loss, (-1.28 - 0.5 + 1.1 + 0.8) / 4)


def test_ppo_clip_per_token_advantages_broadcast_the_same():
    lp = torch.log(RATIOS)
    a, _ = ppo_clip_loss(lp, torch.zeros(2, 2), ADV, torch.ones(2, 2))
    b, _ = ppo_clip_loss(lp, torch.zeros(2, 2), ADV[:, None].expand(2, 2), torch.ones(2, 2))
    assert close(a, b)


def test_empty_mask_gives_zero_loss_and_zero_gradient():
    lp, loss, metrics = _loss(torch.zeros(2, 2))
    assert loss.item() == 0.0 and metrics["clip_frac"].item() == 0.0
    loss.backward()
    assert torch.equal(lp.grad, torch.zeros(2, 2))
    _, seq_loss, _ = _loss(torch.zeros(2, 2), aggregation="seq-mean-token-mean")
    assert seq_loss.item() == 0.0


def test_masked_garbage_old_logprobs_cannot_make_nan():
    lp = torch.zeros(1, 3, requires_grad=True)
    old = torch.tensor([[0.0, -1e4, float("inf")]])
    loss, _ = ppo_clip_loss(lp, old, torch.tensor([1.0]), torch.tensor([[1, 0, 0]]))
    loss.backward()
    assert close(loss, -1.0) and torch.isfinite(lp.grad).all()


def test_global_denominators_make_split_batches_sum_to_the_full_batch():
    lp = torch.log(RATIOS)
    mask = torch.tensor([[1, 1], [1, 0]])
    for agg in ("token-mean", "seq-mean-token-mean"):
        full, _ = ppo_clip_loss(lp, torch.zeros(2, 2), ADV, mask, aggregation=agg)
        parts = [
            ppo_clip_loss(lp[i : i + 1], torch.zeros(1, 2), ADV[i : i + 1], mask[i : i + 1], aggregation=agg, num_tokens=3, num_seqs=2)[0]
            for i in range(2)
        ]
        assert close(parts[0] + parts[1], full), agg


def test_unknown_aggregation_is_rejected():
    with pytest.raises(ValueError, match=r"aggregation='sum' is unknown; use one of \('token-mean', 'seq-mean-token-mean'\)"):
        masked_aggregate(torch.ones(1, 1), torch.ones(1, 1), "sum")


# ---- off-policy: decoupled objective, dual-clip, log-ratio clamp ----------------------------


def test_decoupled_loss_weights_each_token_by_its_behaviour_weight():
    # prox = the current policy (detached): ratio 1, so per-token loss = -A * w and d/dlogp = -A * w / N
    lp = torch.log(torch.tensor([[0.5, 0.25], [0.2, 0.4]])).requires_grad_(True)
    w = torch.tensor([[2.0, 0.5], [1.0, 0.0]])  # the last token's weight was over the cap: 0
    loss, metrics = ppo_clip_loss(lp, lp.detach(), ADV, torch.ones(2, 2), behaviour_weight=w)
    assert close(loss, (-(1.0 * 2.0) - 1.0 * 0.5 + 1.0 * 1.0 + 0.0) / 4)  # the capped token still counts in N
    loss.backward()
    assert close(lp.grad, [[-2.0 / 4, -0.5 / 4], [1.0 / 4, 0.0]])
    assert close(metrics["ratio_mean"], 1.0) and metrics["clip_frac"].item() == 0.0


def test_decoupled_loss_clips_the_ratio_to_the_proximal_policy_not_to_the_behaviour():
    # current/prox ratio 1.5 with A = +1 is clipped (gradient 0) whatever the behaviour weight;
    # ratio 1.1 is inside the bounds: gradient -A * ratio * w / N
    lp = torch.log(torch.tensor([[1.5, 1.1]])).requires_grad_(True)
    loss, metrics = ppo_clip_loss(lp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2),
                                  behaviour_weight=torch.tensor([[3.0, 0.5]]))
    assert close(loss, (-1.2 * 3.0 - 1.1 * 0.5) / 2)
    loss.backward()
    assert close(lp.grad, [[0.0, -1.1 * 0.5 / 2]])
    assert close(metrics["clip_frac"], 0.5)


def test_dual_clip_bounds_the_loss_of_negative_advantage_tokens():
    # A = -1: ratio 5 -> max(5, 1.2) = 5 > c = 3, so the loss is 3 with no gradient; ratio 2 -> 2
    # (under c), gradient -A * ratio / N; A = +1 tokens are never dual-clipped
    lp = torch.log(torch.tensor([[5.0, 2.0], [5.0, 0.5]])).requires_grad_(True)
    adv = torch.tensor([[-1.0, -1.0], [1.0, 1.0]])
    loss, metrics = ppo_clip_loss(lp, torch.zeros(2, 2), adv, torch.ones(2, 2))
    assert close(loss, (3.0 + 2.0 - 1.2 - 0.5) / 4)
    assert close(metrics["dual_clip_frac"], 0.25)
    loss.backward()
    assert close(lp.grad, [[0.0, 2.0 / 4], [0.0, -0.5 / 4]])
    off, _ = ppo_clip_loss(lp.detach(), torch.zeros(2, 2), adv, torch.ones(2, 2), clip_ratio_c=None)
    assert close(off, (5.0 + 2.0 - 1.2 - 0.5) / 4)
    with pytest.raises(ValueError, match=r"clip_ratio_c=1.0 must be > 1"):
        ppo_clip_loss(lp, torch.zeros(2, 2), adv, torch.ones(2, 2), clip_ratio_c=1.0)


def test_a_wild_log_ratio_is_clamped_and_cannot_make_nan():
    # log-ratio 100: exp overflows float32 to inf and its gradient to NaN without the clamp at 20
    lp = torch.tensor([[100.0, -100.0]], requires_grad=True)
    for adv in (1.0, -1.0):
        loss, metrics = ppo_clip_loss(lp, torch.zeros(1, 2), torch.tensor([adv]), torch.ones(1, 2))
        grad, = torch.autograd.grad(loss, lp)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
        assert close(metrics["approx_kl"], 0.0)  # the clamped log-ratios: (-20 + 20) / 2
    # A = +1: tokens at ratio e^20 and e^-20: max(-e^20, -1.2) = -1.2 and max(-e^-20, -0.8) = -e^-20
    loss, _ = ppo_clip_loss(lp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2))
    assert close(loss, (-1.2 - math.exp(-20.0)) / 2)


# ---- KL --------------------------------------------------------------------------------------


def test_kl_estimators_exact():
    lp = torch.full((1, 2), math.log(0.5))
    ref = torch.full((1, 2), math.log(0.25))
    mask = torch.tensor([[1, 0]])
    ln2 = math.log(2.0)
    assert close(kl_penalty(lp, ref, mask, kind="k1"), ln2)
    assert close(kl_penalty(lp, ref, mask, kind="k2"), 0.5 * ln2 * ln2)
    assert close(kl_penalty(lp, ref, mask, kind="k3"), 0.5 + ln2 - 1.0)
    assert kl_penalty(lp, lp, mask).item() == 0.0
    assert kl_penalty(lp, ref, torch.zeros(1, 2)).item() == 0.0
    assert kl_penalty(lp, torch.tensor([[math.log(0.25), float("-inf")]]), mask).isfinite()


def test_k3_is_clamped_at_ten_per_token():
    lp = torch.zeros(1, 2, requires_grad=True)
    ref = torch.tensor([[5.0, 1.0]])  # d = 5: e^5 - 6 = 142.4 -> 10; d = 1: e - 2
    kl = kl_penalty(lp, ref, torch.ones(1, 2), kind="k3")
    assert close(kl, (10.0 + math.e - 2.0) / 2, tol=1e-5)
    grad, = torch.autograd.grad(kl, lp)
    assert close(grad, [[0.0, -(math.e - 1.0) / 2]], tol=1e-5)  # the clamped token pulls no more


def test_unknown_kl_kind_is_rejected():
    with pytest.raises(ValueError, match=r"kind='k4' is unknown; use one of \('k1', 'k2', 'k3'\)"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), kind="k4")
