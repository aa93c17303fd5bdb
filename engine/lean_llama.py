"""A lean forward for Llama-architecture models over the slot KV cache (`engine.kv_slots`), for `engine.generation`.

Why: a transformers forward is generic. Per decode step it builds masks and position embeddings, dispatches
through attention interfaces and output dataclasses, and runs 7 separate projections per layer; at one row
a step is small matmuls, so that plumbing and the per-call cost of each matmul weigh as much as the
arithmetic. This forward does the same math with fewer, larger operations:

- q, k and v are one projection, and gate and up another (4 matmuls per layer instead of 7). The fused
  weights are the model's own storage: each original Linear's weight becomes a view into the fused tensor,
  so there is no second copy, and the engine's in-place weight updates (`state_dict()[name].copy_`) land
  in the fused tensors.
- rotary cos/sin come from a table built once by the model's own rotary module (same values as its
  forward computes per step), indexed by position.
- RMSNorm is one fused `rms_norm` in fp32, as the model's norm computes it.
- decode attention is `kv_slots.slot_attention`'s folded grouped-query matmuls; prefill is causal SDPA
  with grouped-query support, as the model's SDPA path.
- bf16 projections run on weights prepacked for oneDNN (`mkldnn._reorder_linear_weight`), where the CPU
  has bf16 support: a plain bf16 `linear` repacks (or reads unblocked) its weight on every call, so the
  packed kernel is faster, with the same results to the bit (docs/performance.md). The packed copies are extra
  memory (the bf16 weights once more, 270 MB for SmolLM2) and go stale when weights change: the engine
  calls `repack()` after every weight update.

Supported: `LlamaForCausalLM` without biases, with SiLU MLPs and position-only RoPE (default, linear,
llama3, yarn...; not `dynamic`, which rescales with the sequence length). Anything else keeps the
transformers forward (`lean_support` says why). Logits match the transformers forward to 1e-4 in fp32
(tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from engine.kv_slots import SlotCache


def lean_support(model: Any) -> str | None:
    """None when `LeanLlama` can run this model, else why not."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) != "llama":
        return f"model_type {getattr(config, 'model_type', None)!r} is not 'llama'"
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return "attention or MLP biases"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r}"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if "dynamic" in str(rope.get("rope_type", rope.get("type", "default"))):
        return "dynamic RoPE (its frequencies depend on the sequence length)"
    return None


class _Weight:
    """A projection's weight [out, in]; bf16 ones also held prepacked for oneDNN (see the module doc)."""

    def __init__(self, weight: torch.Tensor, pack: bool) -> None:
        self.weight, self.pack = weight, pack
        self.packed: torch.Tensor | None = None
        self.repack()

    def repack(self) -> None:
        if self.pack:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight)
        # oneDNN compiles (and caches, up to 1024 entries) one kernel per input row count: rows padded to a
        # bucket reuse a few kernels instead of compiling one for every prompt length and batch size.
        flat = x.reshape(-1, x.shape[-1])
        rows = flat.shape[0]
        padded = linear_rows_bucket(rows)
        if padded != rows:
            flat = F.pad(flat, (0, 0, 0, padded - rows))
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, None, "none", [], "")
        return out[:rows].view(*x.shape[:-1], out.shape[-1])


def linear_rows_bucket(rows: int) -> int:
    """`rows` rounded up to a multiple of 8, and above 64 to one of 8 sizes per power of two (at most 12.5% more)."""
    step = 8 if rows <= 64 else 1 << (rows.bit_length() - 4)
    return -(-rows // step) * step


def _can_pack(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


@dataclass
class _Layer:
    input_norm: torch.Tensor
    qkv: _Weight  # [(heads + 2 kv_heads) * head_dim, hidden]
    o: _Weight
    post_norm: torch.Tensor
    gate_up: _Weight  # [2 * intermediate, hidden]
    down: _Weight


class LeanLlama:
    """Prefill and decode steps of a Llama model over a `SlotCache`; the model's weights fused in place."""

    def __init__(self, model: Any, pack: bool = True) -> None:
        why = lean_support(model)
        if why:
            raise ValueError(f"the lean forward does not support this model: {why}")
        config = model.config
        base = model.model
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.eps = float(config.rms_norm_eps)
        self.scaling = self.head_dim ** -0.5
        self.embed = base.embed_tokens.weight
        self.norm = base.norm.weight
        self.device = self.embed.device  # every tensor built here lives beside the weights
        pack = pack and _can_pack(self.embed)
        self.lm_head = _Weight(model.lm_head.weight, pack)
        with torch.no_grad():
            self.layers = [_Layer(layer.input_layernorm.weight,
                                  _Weight(_fuse([layer.self_attn.q_proj, layer.self_attn.k_proj,
                                                 layer.self_attn.v_proj]), pack),
                                  _Weight(layer.self_attn.o_proj.weight, pack), layer.post_attention_layernorm.weight,
                                  _Weight(_fuse([layer.mlp.gate_proj, layer.mlp.up_proj]), pack),
                                  _Weight(layer.mlp.down_proj.weight, pack))
                           for layer in base.layers]
            positions = torch.arange(int(config.max_position_embeddings), device=self.device)[None]
            cos, sin = base.rotary_emb(self.embed[:1], positions)
        half = self.head_dim // 2
        # rotate_half(x) * sin == flip_halves(x) * [-sin_first_half, sin_second_half]: one flip, no negation per step.
        self.cos, self.sin_signed = cos[0], torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1)
        self._qk = (self.heads + self.kv_heads) * self.head_dim  # q and k lead the fused output: one rotary for both

    @property
    def packed(self) -> bool:
        return self.lm_head.packed is not None

    def repack(self) -> None:
        """Rebuild the prepacked copies from the (updated) weights."""
        for weight in [self.lm_head] + [w for layer in self.layers for w in (layer.qkv, layer.o, layer.gate_up,
                                                                              layer.down)]:
            weight.repack()

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused op: the model's norm computes x * rsqrt(mean(x^2) + eps) * w
            return F.rms_norm(x, (x.shape[-1],), weight, eps=self.eps)
        # Half precision: normalised in fp32, rounded, then scaled by the weight, as the model's norm rounds.
        return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
        """x * cos + rotate_half(x) * sin over the last axis (head_dim)."""
        flipped = x.unflatten(-1, (2, self.head_dim // 2)).flip(-2).flatten(-2)
        return torch.addcmul(x * cos, flipped, sin_signed)

    def decode(self, tokens: torch.Tensor, cache: SlotCache, mask: torch.Tensor) -> torch.Tensor:
        """Logits [rows, vocab] for one new token per row (`cache.begin_decode()` gave `mask`)."""
        rows = tokens.shape[0]
        positions = cache.lengths[:rows].to(self.device)
        cos, sin = self.cos[positions][:, None], self.sin_signed[positions][:, None]  # [rows, 1, head_dim]
        group, kv_heads, head_dim = self.heads // self.kv_heads, self.kv_heads, self.head_dim
        bias = self._decode_bias(mask)
        x = F.embedding(tokens.to(self.device), self.embed)  # [rows, hidden]
        for index, layer in enumerate(self.layers):
            qkv = layer.qkv(self._rms(x, layer.input_norm))
            qk = self._rope(qkv[:, :self._qk].view(rows, self.heads + kv_heads, head_dim), cos, sin)
            keys, values = cache.update(qk[:, self.heads:, None], qkv[:, self._qk:].view(rows, kv_heads, 1, head_dim),
                                        index)
            # Query heads folded per key/value head (as kv_slots.slot_attention): no copy of the cache.
            queries = qk[:, :self.heads].reshape(rows, kv_heads, group, head_dim)
            attended = self._decode_attention(queries, keys, values, bias)
            x = x + layer.o(attended.reshape(rows, self.heads * head_dim))
            gate, up = layer.gate_up(self._rms(x, layer.post_norm)).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        return self.lm_head(self._rms(x, self.norm))

    def _decode_bias(self, mask: torch.Tensor) -> torch.Tensor:
        """The decode mask [rows, 1, 1, span] as an additive bias [rows * kv_heads, 1, span], once per step: each
        layer then fuses scaling and masking into one baddbmm."""
        rows, span = mask.shape[0], mask.shape[-1]
        bias = torch.zeros(mask.shape, dtype=self.embed.dtype, device=self.device).masked_fill_(~mask, float("-inf"))
        return bias.expand(rows, self.kv_heads, 1, span).reshape(rows * self.kv_heads, 1, span)

    def _decode_attention(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                          bias: torch.Tensor) -> torch.Tensor:
        """queries [rows, kv_heads, group, d] over every allocated column of keys, values [rows, kv_heads, span, d].

        Every row reads the whole span, its padded columns too: a slice of the column axis is not contiguous,
        and oneDNN's batched matmul copies it first, which costs more than reading the padding; SDPA reads a
        slice in place but did not pay either, one call per row (`benchmarks/speed/decode_attention.py`,
        docs/performance.md).
        """
        rows, kv_heads, group, head_dim = queries.shape
        span = keys.shape[2]
        scores = torch.baddbmm(bias, queries.reshape(rows * kv_heads, group, head_dim),
                               keys.reshape(rows * kv_heads, span, head_dim).transpose(1, 2), alpha=self.scaling)
        return torch.bmm(scores.softmax(dim=-1), values.reshape(rows * kv_heads, span, head_dim))

    def prefill(self, input_ids: torch.Tensor, cache: SlotCache, last: torch.Tensor | None,
                offset: int = 0) -> torch.Tensor | None:
        """Logits [prompts, vocab] at index `last` of each right-padded prompt row (None: no logits).

        `cache.begin_prefill` first; or, with `offset` > 0, `cache.begin_extend`: the rows already hold
        `offset` tokens (a shared prefix) that these tokens follow and attend to.
        """
        prompts, width = input_ids.shape
        cos = self.cos[offset:offset + width][None, :, None]  # [1, width, 1, head_dim]
        sin = self.sin_signed[offset:offset + width][None, :, None]
        # Right padding: under the plain causal mask every real token sees only real tokens before it; all of
        # the prefix (columns < offset) is before every one of them.
        bias = torch.full((width, offset + width), float("-inf"), dtype=self.embed.dtype,
                          device=self.device).triu_(offset + 1)
        x = F.embedding(input_ids.to(self.device), self.embed)  # [prompts, width, hidden]
        for index, layer in enumerate(self.layers):
            qkv = layer.qkv(self._rms(x, layer.input_norm))
            qk = self._rope(qkv[..., :self._qk].view(prompts, width, self.heads + self.kv_heads, self.head_dim),
                            cos, sin).transpose(1, 2)
            q, k = qk[:, :self.heads], qk[:, self.heads:]
            v = qkv[..., self._qk:].view(prompts, width, self.kv_heads, self.head_dim).transpose(1, 2)
            k, v = cache.update(k, v, index)
            x = x + layer.o(self._causal_attention(q, k, v, bias))
            gate, up = layer.gate_up(self._rms(x, layer.post_norm)).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        if last is None:
            return None
        x = x[torch.arange(prompts, device=self.device), last.to(self.device)]
        return self.lm_head(self._rms(x, self.norm))

    def _causal_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor
                          ) -> torch.Tensor:
        """q [prompts, heads, width, d] over k, v [prompts, kv_heads, keys, d] under `bias` [width, keys]: [prompts, width, heads*d].

        Plain batched matmuls over the whole score matrix, not SDPA: CPU flash attention ran a prompt's
        attention at ~12 GFLOP/s in bf16 (27% of a prefill for 10% of its FLOPs, profiled), matmuls at
        GEMM speed even with the masked half computed. Each key/value head's query heads are folded into
        the matmul's rows, so the keys are not repeated.
        """
        prompts, heads, width, head_dim = q.shape
        group, keys = heads // self.kv_heads, k.shape[2]
        folded = q.reshape(prompts * self.kv_heads, group * width, head_dim)
        scores = torch.baddbmm(bias.repeat(group, 1), folded,
                               k.reshape(prompts * self.kv_heads, keys, head_dim).transpose(1, 2), alpha=self.scaling)
        attended = torch.bmm(scores.softmax(dim=-1), v.reshape(prompts * self.kv_heads, keys, head_dim))
        return attended.view(prompts, heads, width, head_dim).transpose(1, 2).reshape(prompts, width, heads * head_dim)


def _fuse(linears: list[torch.nn.Linear]) -> torch.Tensor:
    """One weight [sum of outputs, inputs]; each Linear's weight becomes a view of its rows (no second copy)."""
    fused = torch.cat([linear.weight.detach() for linear in linears])
    start = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight.data = fused[start:start + rows]
        start += rows
    return fused
