"""The slot KV cache's bookkeeping and its grouped-query attention, on hand-built tensors."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from common.kv_slots import SlotCache, slot_attention

CONFIG = SimpleNamespace(num_hidden_layers=2, num_key_value_heads=1, num_attention_heads=2, head_dim=2, hidden_size=4)


def _filled(lengths: list[int]) -> SlotCache:
    """Rows whose every cached key/value element equals its row number + 1."""
    cache = SlotCache(CONFIG, torch.float32, max_rows=8, max_columns=64)
    width = max(lengths)
    cache.begin_prefill(len(lengths), width)
    for layer in range(CONFIG.num_hidden_layers):
        kv = torch.arange(1.0, len(lengths) + 1).view(-1, 1, 1, 1).expand(len(lengths), 1, width, 2)
        cache.update(kv, kv, layer)
    cache.end_prefill(lengths)
    return cache


def test_decode_mask_covers_each_rows_tokens_and_the_new_one() -> None:
    cache = _filled([2, 4])
    mask = cache.begin_decode()
    # Decode attends over the whole allocated buffer (64 columns here): the mask closes everything past each row.
    assert mask.shape == (2, 1, 1, 64)
    assert mask[:, 0, 0, :5].tolist() == [[True, True, True, False, False], [True, True, True, True, True]]
    assert not mask[:, 0, 0, 5:].any()
    new = torch.tensor([10.0, 20.0]).view(2, 1, 1, 1).expand(2, 1, 1, 2)
    keys, _ = cache.update(new, new, 0)
    assert keys.shape == (2, 1, 64, 2) and keys.is_contiguous()  # no copy in the attention's matmuls
    # Written at column 2 over the prompt's padding (column 3 still holds padding, masked; 4 was never written).
    assert keys[0, 0, :6, 0].tolist() == [1, 1, 10, 1, 0, 0]
    assert keys[1, 0, :6, 0].tolist() == [2, 2, 2, 2, 20, 0]
    cache.end_decode()
    assert cache.lengths.tolist() == [3, 5]


def test_remove_moves_the_last_rows_into_the_holes() -> None:
    cache = _filled([1, 2, 3, 4, 5])
    assert cache.duplicate(2) == 5 and cache.lengths.tolist() == [1, 2, 3, 4, 5, 3]
    assert cache.keys[1][5, 0, :3, 0].tolist() == [3, 3, 3]
    moves = cache.remove([1, 3, 5])  # keep 3 rows: hole 1 gets row 4; rows 3 and 5 were past the end or gone
    assert moves == [(4, 1)]
    assert cache.rows == 3 and cache.lengths.tolist() == [1, 5, 3]
    assert cache.values[0][1, 0, :5, 1].tolist() == [5, 5, 5, 5, 5]
    cache.remove([0, 1, 2])
    assert cache.rows == 0 and cache.capacity == (0, 0)  # an empty batch frees the buffers


def test_folded_attention_equals_repeated_heads_with_a_mask() -> None:
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(3, 6, 1, 4, generator=generator)  # 6 query heads over 2 key/value heads
    key, value = torch.randn(3, 2, 5, 4, generator=generator), torch.randn(3, 2, 5, 4, generator=generator)
    mask = (torch.arange(5) < torch.tensor([[2], [5], [1]])).view(3, 1, 1, 5)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    out, _ = slot_attention(module, query, key, value, mask)
    reference = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(3, dim=1), value.repeat_interleave(3, dim=1), attn_mask=mask)
    assert out.shape == (3, 1, 6, 4)
    torch.testing.assert_close(out, reference.transpose(1, 2))
    # Row 2 sees one key: its output is that key's value, per head group.
    torch.testing.assert_close(out[2, 0, :3], value[2, 0, 0].expand(3, 4))
