"""The slot KV cache's bookkeeping and its grouped-query attention, on hand-built tensors."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from engine.kv_slots import SlotCache, slot_attention

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


def _layer_bytes(rows: int, columns: int) -> int:
    return rows * CONFIG.num_key_value_heads * columns * CONFIG.head_dim * 4  # fp32


def test_buffers_grow_in_chunks_one_layer_at_a_time() -> None:
    cache = SlotCache(CONFIG, torch.float32, max_rows=32, max_columns=1024)
    cache.begin_prefill(1, 3)
    for layer in range(CONFIG.num_hidden_layers):
        cache.update(torch.full((1, 1, 3, 2), 7.0), torch.full((1, 1, 3, 2), 7.0), layer)
    cache.end_prefill([3])
    assert cache.capacity == (4, 128) and cache.reallocations == 1  # 4 rows (a chunk), not 1 then 2 then 4
    for _ in range(4):
        cache.duplicate(0)
    # 5 rows: the next chunk (8), not doubling to 8 by luck: 9 rows give 12, not 16.
    assert cache.capacity == (8, 128)
    for _ in range(4):
        cache.duplicate(0)
    assert cache.capacity == (12, 128) and cache.reallocations == 3
    assert cache.keys[1][8, 0, :4, 0].tolist() == [7, 7, 7, 0]  # copied rows survived both reallocations
    # 4 buffers (2 layers x keys, values): growing 8 -> 12 rows held the new cache plus one old layer at most.
    assert cache.peak_bytes == 4 * _layer_bytes(12, 128) + _layer_bytes(8, 128)
    assert cache.nbytes == 4 * _layer_bytes(12, 128)
    cache.reserve(12, 300)  # columns by blocks of 128
    assert cache.capacity == (12, 384)


def test_buffers_shrink_when_half_empty_and_keep_their_tokens() -> None:
    cache = _filled([1, 2, 3, 4, 5, 6, 7, 8])
    assert cache.capacity == (8, 64)  # max_columns 64 caps the 128-column block
    cache.remove([1, 2, 3])  # 5 rows left need 8 slots: no shrink
    assert cache.capacity == (8, 64)
    cache.remove([0, 2, 3])  # left: lengths 5 (moved into slot 0) and 6 -> 4 slots, half of 8
    assert cache.rows == 2 and cache.capacity == (4, 64)
    assert cache.lengths.tolist() == [5, 6]
    for row, length in enumerate(cache.lengths.tolist()):
        assert cache.keys[0][row, 0, :length, 0].tolist() == [float(length)] * length


def test_cache_holds_the_serving_dtype() -> None:
    cache = SlotCache(CONFIG, torch.bfloat16, max_rows=4, max_columns=64)
    cache.begin_prefill(1, 2)
    assert all(t.dtype == torch.bfloat16 for t in cache.keys + cache.values)
    cache.end_prefill([2])
    assert cache.nbytes == 4 * 4 * 1 * 64 * 2 * 2  # 4 buffers of [4 rows, 1 head, 64 columns, 2] bf16


def test_capacity_stays_readable_from_another_thread_while_the_cache_grows_and_frees() -> None:
    # The engine's thread resizes the cache while stats readers (and the engine tests) read `capacity`:
    # a growing cache's first layers were once 1-d placeholders, and CI caught the IndexError.
    import sys
    import threading

    config = SimpleNamespace(num_hidden_layers=24, num_key_value_heads=1, num_attention_heads=2, head_dim=2,
                             hidden_size=4)
    cache = SlotCache(config, torch.float32, max_rows=8, max_columns=64)
    stop, errors, seen = threading.Event(), [], set()

    def read() -> None:
        while not stop.is_set():
            try:
                seen.add(cache.capacity)
            except Exception as error:  # noqa: BLE001 - any failure to read is the bug
                errors.append(error)
                return

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, so the reader lands inside a resize
    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(100):
            cache.begin_prefill(4, 8)
            cache.end_prefill([8] * 4)
            cache.remove([0, 1, 2, 3])
    finally:
        stop.set()
        reader.join()
        sys.setswitchinterval(interval)
    assert not errors, errors[0]
    assert seen <= {(0, 0), (4, 64)} and (4, 64) in seen


def test_an_exported_row_loads_back_as_a_new_row_with_its_tokens() -> None:
    cache = _filled([2, 4])
    keys, values = cache.export_row(1)
    assert [k.shape for k in keys] == [torch.Size([1, 4, 2])] * CONFIG.num_hidden_layers  # its 4 tokens only
    cache.remove([0, 1])  # the batch empties and its buffers are freed; the export is a copy
    assert cache.capacity == (0, 0) and keys[0][0, :, 0].tolist() == [2, 2, 2, 2]
    slot = cache.load_row(keys, values)
    assert slot == 0 and cache.rows == 1 and cache.lengths.tolist() == [4]
    assert cache.keys[1][0, 0, :5, 0].tolist() == [2, 2, 2, 2, 0] and cache.values[0][0, 0, :4, 1].tolist() == [2] * 4
