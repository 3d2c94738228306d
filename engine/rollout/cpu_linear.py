"""The rollout engine's linear layers on CPU through oneDNN's matmul (the library vLLM's CPU backend uses).

PyTorch runs a float32 `F.linear` on CPU through MKL's sgemm. On the skinny shapes of decode (a few
rows against a large weight) oneDNN's matmul is faster on this project's CPUs; `bench.decode` reports
what it buys. `route_linears(model)` turns every plain float32/bfloat16 `nn.Linear` into a
`OneDnnLinear`: the same module with the same Parameter objects (a weight update copied in place
reaches it), only its forward differs, and only inside `engine_forward()` with autograd off and a
CPU weight. The trainer, `model.generate` and anything else sharing the model keep `F.linear`.

oneDNN reads the weight in its plain row-major layout (no packed copy), so routing costs no memory.
A linear whose weight or input is a DTensor (a TP shard, engine/rollout/tp.py, also when sharded after
routing) keeps `F.linear`, which DTensor dispatches; where oneDNN is missing or fails a probe,
nothing is routed.

Invariants (tests/engine/rollout/test_cpu_linear.py): inside `engine_forward()` outputs equal `F.linear`'s to float
rounding (2-D, 3-D, non-contiguous inputs, with and without bias, bfloat16); outside it, or with grad
on, oneDNN is never called and gradients flow; a weight copied in place is the one used; the engine's
greedy tokens equal `generate`'s. tests/engine/rollout/test_tp.py: a model sharded over TP after its engine routed
it gives TP1's logits.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

_state = threading.local()


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@functools.cache
def onednn_available() -> bool:
    """Whether this torch build runs oneDNN's linear, checked once against `F.linear` on a tiny probe."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        x, w, b = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
        return torch.allclose(_onednn_linear(x, w, b), F.linear(x, w, b), atol=1e-5)
    except (RuntimeError, AttributeError) as exc:  # an op missing from this build
        log.info("[libra rollout] oneDNN linear unavailable, keeping F.linear: %s", exc)
        return False


class OneDnnLinear(nn.Linear):
    """`nn.Linear` whose no-grad forward inside `engine_forward()` runs oneDNN's matmul."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        # plain tensors only: a DTensor (sharded after routing, engine/rollout/tp.py) takes F.linear, which DTensor dispatches
        if (getattr(_state, "active", False) and not torch.is_grad_enabled() and type(weight) is nn.Parameter
                and type(x) is torch.Tensor and x.dtype == weight.dtype and weight.device.type == "cpu"):
            return _onednn_linear(x, weight, self.bias)
        return F.linear(x, weight, self.bias)


def route_linears(model: nn.Module) -> int:
    """Route `model`'s float32/bfloat16 `nn.Linear`s through oneDNN (in place); how many were routed."""
    if not onednn_available():
        return 0
    routed = 0
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.dtype in (torch.float32, torch.bfloat16):
            module.__class__ = OneDnnLinear
            routed += 1
    return routed


@contextlib.contextmanager
def engine_forward():
    """Routed linears run oneDNN inside this block (this thread only)."""
    prev = getattr(_state, "active", False)
    _state.active = True
    try:
        yield
    finally:
        _state.active = prev
