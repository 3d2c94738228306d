"""engine/rollout/cpu_linear.py: the rollout engine's oneDNN linears equal F.linear, and only the engine gets them."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.rollout.cpu_linear import OneDnnLinear, engine_forward, onednn_available, route_linears

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN linear")


def _routed(bias: bool, dtype=torch.float32) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96, bias=bias), nn.ReLU(), nn.Linear(96, 32, bias=bias)).to(dtype)
    assert route_linears(model) == 2
    assert all(type(m) is OneDnnLinear for m in (model[0], model[2]))
    return model


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(8, 64), (3, 5, 64), "transposed"])
def test_inside_the_engine_outputs_equal_f_linear(bias, shape):
    model = _routed(bias)
    x = torch.randn(64, 8).t() if shape == "transposed" else torch.randn(*shape)
    with torch.no_grad():
        plain = model(x)
        with engine_forward():
            fast = model(x)
    assert fast.shape == plain.shape
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)


def test_bfloat16_weights_are_routed_too():
    model = _routed(True, torch.bfloat16)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with torch.no_grad(), engine_forward():
        fast = model(x)
    torch.testing.assert_close(fast.float(), F.linear(F.relu(F.linear(x, model[0].weight, model[0].bias)),
                                                      model[2].weight, model[2].bias).float(), rtol=2e-2, atol=2e-2)


def test_outside_the_engine_or_with_grad_it_is_f_linear_and_trains(monkeypatch):
    model = _routed(True)
    x = torch.randn(4, 64)
    calls = []
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr("engine.rollout.cpu_linear._onednn_linear", lambda *a: calls.append(1) or real(*a, "none", [], ""))
    with torch.no_grad():
        model(x)
    with engine_forward():  # grad on: the trainer's path
        out = model(x)
    out.sum().backward()
    assert not calls
    assert model[0].weight.grad is not None and model[0].weight.grad.abs().sum() > 0
    with torch.no_grad(), engine_forward():
        model(x)
    assert len(calls) == 2
    with torch.no_grad():  # the flag is restored on exit
        model(x)
    assert len(calls) == 2


def test_a_weight_copied_in_place_is_the_one_used():
    model = _routed(False)
    x = torch.randn(4, 64)
    with torch.no_grad():
        model[0].weight.copy_(torch.randn_like(model[0].weight))
        with engine_forward():
            fast = model(x)
        plain = F.linear(F.relu(F.linear(x, model[0].weight)), model[2].weight)
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)


def test_the_engine_greedy_tokens_equal_generate_on_the_tiny_model():
    from engine.models import build_tiny
    from engine.rollout.runner import BatchRunner

    model, _ = build_tiny(0)
    ids = [[5, 17, 42, 99, 7], [250, 3, 8, 11, 12]]
    with torch.no_grad():
        want = model.generate(input_ids=torch.tensor(ids), attention_mask=torch.ones(2, 5, dtype=torch.long),
                              max_new_tokens=6, do_sample=False, pad_token_id=0)[:, 5:].tolist()
    runner = BatchRunner(model, device="cpu")
    assert any(type(m) is OneDnnLinear for m in model.modules())
    logits = runner.prefill(["a", "b"], ids)
    runner.admit(["a", "b"])
    got = [[], []]
    for _ in range(6):
        tokens = logits.argmax(-1).tolist()
        for row, t in zip(got, tokens):
            row.append(t)
        logits = runner.decode(tokens)
    assert got == want
