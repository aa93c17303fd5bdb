"""A preallocated KV cache with one slot per running row, and the attention that reads it (for `engine.generation`).

Why not HF's DynamicCache: it concatenates every layer's keys and values on every decode step, and joining
rows of different lengths left-pads and concatenates the whole cache again; with an attention mask, HF's
SDPA path also repeats each key/value head for its query heads (a 3x copy of the cache per layer and step
for SmolLM2). At 32 rows those copies moved more bytes per step than the weights.

Here row r of the batch lives in slot r: its tokens at columns 0..lengths[r]-1 of per-layer buffers
[slots, kv_heads, capacity, head_dim]. A decode step writes one column per row in place and attends over
every allocated column with a per-row mask. Not just columns 0..max length: CPU matmul (bf16 always, fp32
in the batched case) copies an operand that is not contiguous, and a slice of the column axis is not; that
copy cost more than reading the < _BLOCK masked columns past the longest row (zeros keep them harmless;
benchmarks/decode_step.py). Rows that finish leave a hole that the last row moves into (copying only that row).

Memory (the trainer's engine holds fp32 slots beside the training model and the optimizer; doubling got
trainer actors OOM-killed): buffers are sized to what the batch needs, in chunks of _ROW_CHUNK rows and
_BLOCK columns, not doubled; they are reallocated one layer at a time, so growing holds the old cache plus
one layer, not two caches; they shrink once the rows left need at most half of them, and are freed (and
the freed pages handed back to the OS) when the batch empties. They hold the serving dtype (bf16 halves them).

Attention (`ATTENTION`, registered with transformers): a single-token query folds each key/value head's
query heads into the query-length axis, so grouped-query attention needs no copy of the cache, and runs as
two batched matmuls (about half the time of SDPA's CPU kernel for 3 query lines, profiled at 32 rows); prompts
(several tokens, right-padded) run causal SDPA with grouped-query support and no mask.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ATTENTION = "evolver_slots"
_BLOCK = 128  # columns added at a time: reallocations stay rare without reserving the whole context
_ROW_CHUNK = 4  # rows added at a time (a GRPO group): 32 rows that join one by one reallocate 8 times


def slot_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                   **kwargs: Any) -> tuple[torch.Tensor, None]:
    """SDPA where a one-token query over a [rows, 1, 1, keys] mask attends without repeating key/value heads."""
    batch, heads, q_len, head_dim = query.shape
    kv_heads = key.shape[1]
    if q_len != 1 or attention_mask is None or attention_mask.shape[1] != 1 or heads % kv_heads:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    # Query head h reads key/value head h // group (as HF's repeat_kv): [rows, kv_heads, group, head_dim].
    folded = query.view(batch, kv_heads, heads // kv_heads, head_dim)
    # Plain batched matmuls: for a few query lines, SDPA's CPU flash kernel cost ~3x more here (profiled).
    scores = torch.matmul(folded, key.transpose(-1, -2)) * (scaling if scaling is not None else head_dim ** -0.5)
    scores = scores.masked_fill(~attention_mask, float("-inf")).softmax(dim=-1)
    return torch.matmul(scores, value).reshape(batch, 1, heads, head_dim), None


AttentionInterface.register(ATTENTION, slot_attention)


class SlotCache:
    """Per-layer key/value buffers; rows are slots 0..rows-1. Passed to the model as `past_key_values`."""

    def __init__(self, config: Any, dtype: torch.dtype, max_rows: int, max_columns: int) -> None:
        self.layers = int(config.num_hidden_layers)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        self.dtype, self.max_rows, self.max_columns = dtype, max_rows, max_columns
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.lengths = torch.zeros(0, dtype=torch.long)  # tokens cached per row
        self.rows = 0
        self._write: torch.Tensor | None = None  # decode: per (row, kv head), its flat [slot, head, column] index
        self._prefill: tuple[int, int] | None = None  # prefill: (first slot, width)
        self._extend: tuple[int, int, int, int] | None = None  # extend: (first slot, rows, offset, width)
        self._span = 0  # columns the current decode step attends over: the whole buffer (see above)
        self.reallocations = 0
        self.peak_bytes = 0  # the most bytes the buffers held at once (a reallocation's overlap included)

    # ---- what the HF model calls ----------------------------------------------------------
    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if self._prefill is not None:  # store the prompt; it attends only to itself
            first, width = self._prefill
            keys[first:first + key.shape[0], :, :width] = key
            values[first:first + key.shape[0], :, :width] = value
            return key, value
        if self._extend is not None:  # store the prompts' continuations; they attend to what the rows hold too
            first, count, offset, width = self._extend
            keys[first:first + count, :, offset:offset + width] = key
            values[first:first + count, :, offset:offset + width] = value
            return keys[first:first + count, :, :offset + width], values[first:first + count, :, :offset + width]
        assert self._write is not None, "SlotCache.update outside a prefill or decode step"
        # One index_copy_ per buffer into its [slots * kv_heads * columns, head_dim] view (flat indices from
        # begin_decode): mixed advanced indexing cost ~5% of a 32-row bf16 step (profiled).
        flat = self._write
        keys.view(-1, self.head_dim).index_copy_(0, flat, key[:, :, 0].reshape(-1, self.head_dim))
        values.view(-1, self.head_dim).index_copy_(0, flat, value[:, :, 0].reshape(-1, self.head_dim))
        return keys[:self.rows, :, :self._span], values[:self.rows, :, :self._span]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self._prefill is not None else self._span

    # ---- what the engine calls -------------------------------------------------------------
    def reserve(self, rows: int, columns: int) -> None:
        """Make room for `rows` rows of `columns` tokens at once (a prefill and its copies: one reallocation)."""
        self._reserve(rows, columns)

    def begin_prefill(self, count: int, width: int) -> int:
        """Make room for `count` new rows of up to `width` prompt tokens; returns their first slot."""
        first = self.rows
        self._reserve(first + count, width)
        self._prefill = (first, width)
        return first

    def begin_extend(self, first: int, count: int, width: int) -> int:
        """Rows first..first+count-1, all holding the same number of tokens (a shared prompt prefix), get up to
        `width` more each (their own prompt suffixes, right-padded); returns that offset."""
        offset = int(self.lengths[first])
        assert bool((self.lengths[first:first + count] == offset).all()), "extended rows must be equally long"
        self._reserve(self.rows, offset + width)
        self._extend = (first, count, offset, width)
        return offset

    def end_extend(self, added: list[int]) -> None:
        first, count, offset, _ = self._extend  # type: ignore[misc]
        self._extend = None
        self.lengths[first:first + count] = offset + torch.tensor(added, dtype=torch.long)

    def end_prefill(self, lengths: list[int]) -> None:
        self._prefill = None
        self.lengths = torch.cat([self.lengths[:self.rows], torch.tensor(lengths, dtype=torch.long)])
        self.rows += len(lengths)

    def duplicate(self, src: int) -> int:
        """A new row holding slot `src`'s tokens (a prompt shared by several rows is prefilled once)."""
        dst = self.rows
        self._reserve(dst + 1, int(self.lengths[src]))
        self.lengths = torch.cat([self.lengths[:dst], self.lengths[src:src + 1]])
        self.rows += 1
        self._copy_row(src, dst)
        return dst

    def export_row(self, slot: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of slot `slot`'s cached keys and values, per layer [kv_heads, length, head_dim]."""
        length = int(self.lengths[slot])
        return ([k[slot, :, :length].clone() for k in self.keys], [v[slot, :, :length].clone() for v in self.values])

    def load_row(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> int:
        """A new row holding exported keys and values (`export_row`); returns its slot."""
        dst, length = self.rows, keys[0].shape[1]
        self._reserve(dst + 1, length)
        for layer in range(self.layers):
            self.keys[layer][dst, :, :length] = keys[layer]
            self.values[layer][dst, :, :length] = values[layer]
        self.lengths = torch.cat([self.lengths[:dst], torch.tensor([length], dtype=torch.long)])
        self.rows += 1
        return dst

    def _copy_row(self, src: int, dst: int) -> None:
        length = int(self.lengths[src])
        for keys, values in zip(self.keys, self.values, strict=True):
            keys[dst, :, :length] = keys[src, :, :length]
            values[dst, :, :length] = values[src, :, :length]
        self.lengths[dst] = length

    def begin_decode(self) -> torch.Tensor:
        """Prepare one token per row at column lengths[r]; returns the attention mask [rows, 1, 1, span]."""
        lengths = self.lengths[:self.rows]
        self._reserve(self.rows, int(lengths.max()) + 1)
        self._span = self.capacity[1]
        heads = torch.arange(self.rows)[:, None] * self.kv_heads + torch.arange(self.kv_heads)[None, :]
        self._write = (heads * self._span + lengths[:, None]).reshape(-1)
        return (torch.arange(self._span) <= lengths[:, None]).view(self.rows, 1, 1, self._span)

    def end_decode(self) -> None:
        self._write = None
        self.lengths[:self.rows] += 1

    def remove(self, indices: list[int]) -> list[tuple[int, int]]:
        """Drop rows; survivors past the new end move into the holes. Returns the (from, to) moves made."""
        gone = set(indices)
        keep = self.rows - len(gone)
        holes = [i for i in sorted(gone) if i < keep]
        movers = [i for i in range(keep, self.rows) if i not in gone]
        for src, dst in zip(movers, holes, strict=True):
            self._copy_row(src, dst)
        self.rows = keep
        self.lengths = self.lengths[:keep].clone()
        if keep == 0:
            if self.keys:  # an idle engine holds no cache memory
                self.keys, self.values = [], []
                return_freed_memory()
        else:
            rows = _chunked(keep, _ROW_CHUNK)
            columns = min(self.max_columns, _chunked(int(self.lengths.max()) + 1, _BLOCK))
            have_rows, have_columns = self.capacity
            if rows * columns * 2 <= have_rows * have_columns:  # half or less in use: worth one copy
                self._resize(rows, columns)
                return_freed_memory()
        return list(zip(movers, holes, strict=True))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    @property
    def capacity(self) -> tuple[int, int]:
        keys = self.keys  # one read: another thread (a test, a stats reader) may see the list replaced mid-call
        return (keys[0].shape[0], keys[0].shape[2]) if keys else (0, 0)

    def _reserve(self, rows: int, columns: int) -> None:
        have_rows, have_columns = self.capacity
        if rows <= have_rows and columns <= have_columns:
            return
        if rows > self.max_rows or columns > self.max_columns:
            raise ValueError(f"the cache holds at most {self.max_rows} rows of {self.max_columns} tokens")
        self._resize(min(self.max_rows, max(have_rows, _chunked(rows, _ROW_CHUNK))),
                     min(self.max_columns, max(have_columns, _chunked(columns, _BLOCK))))

    def _resize(self, rows: int, columns: int) -> None:
        """New [rows, kv_heads, columns, head_dim] buffers holding the cached tokens, one layer at a time."""
        used = int(self.lengths[:self.rows].max()) if self.rows else 0
        shape = (rows, self.kv_heads, columns, self.head_dim)
        if not self.keys:  # empty 4-d placeholders: `capacity` stays readable while layers are replaced
            empty = torch.empty(0, self.kv_heads, 0, self.head_dim, dtype=self.dtype)
            self.keys, self.values = [empty] * self.layers, [empty] * self.layers
        held = self.nbytes
        for buffers in (self.keys, self.values):
            for layer in range(self.layers):
                # Zeros, not empty: masked columns still multiply their (zero) attention weight by the stored value.
                grown = torch.zeros(shape, dtype=self.dtype)
                held += grown.numel() * grown.element_size()
                self.peak_bytes = max(self.peak_bytes, held)
                old = buffers[layer]
                if old.numel():
                    grown[:self.rows, :, :used] = old[:self.rows, :, :used]
                held -= old.numel() * old.element_size()
                buffers[layer] = grown  # the old layer's buffer is freed here, before the next one is allocated
                del old
        self.reallocations += 1


def _chunked(n: int, chunk: int) -> int:
    return -(-n // chunk) * chunk


def return_freed_memory() -> None:
    """Hand freed heap pages back to the OS (glibc keeps buffers below its mmap threshold in the heap)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _load_libc() -> Any:
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc (macOS, musl): nothing to trim
        return None


_LIBC = _load_libc()
