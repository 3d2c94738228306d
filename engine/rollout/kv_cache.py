"""A batched KV cache written in place: decode appends into preallocated columns, never by concatenation.

transformers' DynamicCache grows every layer by `torch.cat` at every decode step, so each step
copies the whole cache once per layer (23% of a SmolLM2 batch-32 decode step on CPU). Here each
layer owns key and value buffers [batch, heads, capacity, head_dim]; `keys`/`values` are views of
the first `length` columns; `update` writes the new columns after them and widens the views.
When the capacity runs out the buffers double (amortised: one copy per doubling, not per step).

A batch change (rows joining or leaving, engine/rollout/runner.py) builds a new cache from
left-padded parts with `left_padded`, which copies each part once into fresh buffers; padding
columns are zeros, so a masked position can never carry a NaN into attention (0 x NaN).

Invariants (tests/engine/rollout/test_kv_cache.py): the model's logits with this cache equal those with a
DynamicCache over prefill and decode steps (to float rounding), including past a capacity
doubling; a view handed out before an update still reads the same values after it.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

SPARE_COLUMNS = 64  # free columns a new cache gets: this many decode steps before the first doubling


class InPlaceLayer(DynamicLayer):
    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int):
        super().__init__()
        self._key_buf, self._value_buf = keys, values
        self.keys, self.values = keys[:, :, :length], values[:, :, :length]
        self.device, self.dtype = keys.device, keys.dtype
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n, m = self.keys.shape[-2], key_states.shape[-2]
        if n + m > self._key_buf.shape[-2]:
            self._key_buf = _grown(self._key_buf, n, max(2 * self._key_buf.shape[-2], n + m))
            self._value_buf = _grown(self._value_buf, n, self._key_buf.shape[-2])
        self._key_buf[:, :, n:n + m] = key_states
        self._value_buf[:, :, n:n + m] = value_states
        self.keys, self.values = self._key_buf[:, :, :n + m], self._value_buf[:, :, :n + m]
        return self.keys, self.values


def _grown(buf: torch.Tensor, used: int, capacity: int) -> torch.Tensor:
    # a fresh buffer, so views handed out earlier keep reading the old one unchanged
    out = buf.new_zeros(*buf.shape[:2], capacity, buf.shape[-1])
    out[:, :, :used] = buf[:, :, :used]
    return out


class InPlaceCache(Cache):
    def __init__(self, layers: list[InPlaceLayer]):
        super().__init__(layers=layers)

    @classmethod
    def left_padded(cls, parts: list[tuple[list[tuple[torch.Tensor, torch.Tensor]], int]], width: int,
                    spare: int = SPARE_COLUMNS) -> "InPlaceCache":
        """One cache from parts (per-layer (keys, values) with b rows and n valid columns, n <= width):
        rows stacked in order, each part's columns right-aligned at `width`, `spare` free columns after."""
        ref = next(kv for kv, n in parts if n)
        rows = sum(kv[0][0].shape[0] if n else 1 for kv, n in parts)
        layers = []
        for li, (k0, v0) in enumerate(ref):
            key_buf = k0.new_zeros(rows, k0.shape[1], width + spare, k0.shape[-1])
            value_buf = v0.new_zeros(rows, v0.shape[1], width + spare, v0.shape[-1])
            row = 0
            for kv, n in parts:
                if not n:  # a request with no KV yet: one all-padding row
                    row += 1
                    continue
                k, v = kv[li]
                b = k.shape[0]
                key_buf[row:row + b, :, width - n:width] = k[:, :, -n:]
                value_buf[row:row + b, :, width - n:width] = v[:, :, -n:]
                row += b
            layers.append(InPlaceLayer(key_buf, value_buf, width))
        return cls(layers)
