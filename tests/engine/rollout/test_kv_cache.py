"""engine/rollout/kv_cache.py: the in-place cache gives a DynamicCache's logits, through a capacity doubling."""

import torch
from transformers import DynamicCache

from engine.rollout.kv_cache import InPlaceCache
from engine.models import build_tiny
from engine.rollout.runner import cache_kwarg


def _decode(model, cache, first_ids, mask, steps: int) -> list[torch.Tensor]:
    """Greedy decode `steps` tokens on top of `cache` (already holding the prompt); the logits of each step."""
    out, ids, lens = [], first_ids, mask.sum(-1)
    for _ in range(steps):
        mask = torch.cat([mask, torch.ones(mask.shape[0], 1, dtype=mask.dtype)], dim=1)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=lens[:, None], **{cache_kwarg(): cache}, use_cache=True).logits[:, -1]
        out.append(logits)
        ids, lens = logits.argmax(-1, keepdim=True), lens + 1
    return out


@torch.no_grad()
def test_in_place_cache_matches_dynamic_cache_across_a_doubling():
    model, _ = build_tiny(0)
    model.eval()
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 200, (n,), generator=gen) for n in (7, 4, 9)]
    width = max(len(p) for p in prompts)
    ids = torch.stack([torch.cat([torch.zeros(width - len(p), dtype=torch.long), p]) for p in prompts])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    prefill = DynamicCache()
    first = model(input_ids=ids, attention_mask=mask, position_ids=pos, **{cache_kwarg(): prefill}, use_cache=True).logits[:, -1]
    first_ids = first.argmax(-1, keepdim=True)
    parts = [([(lay.keys, lay.values) for lay in prefill.layers], width)]

    reference = DynamicCache(ddp_cache_data=[(lay.keys.clone(), lay.values.clone()) for lay in prefill.layers])
    in_place = InPlaceCache.left_padded(parts, width, spare=3)  # 3 spare columns: the 4th step doubles the buffers
    held = in_place.layers[0].keys  # a view handed out before the updates
    held_copy = held.clone()
    want = _decode(model, reference, first_ids, mask, 10)
    got = _decode(model, in_place, first_ids, mask, 10)
    for a, b in zip(want, got):
        assert torch.allclose(a, b, atol=1e-5)
    assert in_place.layers[0]._key_buf.shape[-2] >= width + 10 > width + 3
    assert in_place.get_seq_length() == reference.get_seq_length() == width + 10
    assert torch.equal(held, held_copy)


def test_left_padded_places_each_part_right_aligned_with_zero_padding():
    k1, v1 = torch.ones(1, 2, 3, 4), torch.full((1, 2, 3, 4), 2.0)
    k2, v2 = torch.full((2, 2, 5, 4), 3.0), torch.full((2, 2, 5, 4), 4.0)
    cache = InPlaceCache.left_padded([([(k1, v1)], 3), ([(k2, v2)], 5), (None, 0)], 5, spare=2)
    keys = cache.layers[0].keys
    assert keys.shape == (4, 2, 5, 4) and cache.layers[0]._key_buf.shape == (4, 2, 7, 4)
    assert (keys[0, :, :2] == 0).all() and (keys[0, :, 2:] == 1).all()
    assert (keys[1:3] == 3).all() and (keys[3] == 0).all()
    assert (cache.layers[0].values[0, :, 2:] == 2).all()
