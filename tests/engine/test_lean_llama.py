"""The lean Llama forward against the transformers forward: same logits (fp32), same weights after updates."""

from __future__ import annotations

import pytest
import torch

from engine.generation import Engine, SamplingParams
from engine.kv_slots import ATTENTION, SlotCache
from engine.lean_llama import LeanLlama, _can_pack, _Weight, lean_support, linear_rows_bucket
from engine.models import load_model


def _reference_logits(model: torch.nn.Module, sequences: list[list[int]]) -> list[torch.Tensor]:
    with torch.inference_mode():
        return [model(torch.tensor([ids])).logits[0] for ids in sequences]


@pytest.mark.parametrize("spec", ["tiny", "smollm2"])
def test_prefill_and_decode_logits_equal_the_transformers_forward(spec: str) -> None:
    model, tok = load_model(spec)
    model.eval()
    # Rows of mixed lengths, one past the cache's first block of columns: every row attends over the whole
    # allocated span, and its padded columns must not change its logits.
    texts = ("the red key opens the box", "go", "take the lamp, then go north twice " * 20)
    prompts = [tok.encode(t) for t in texts]
    assert max(len(p) for p in prompts) > 128 > 4 * min(len(p) for p in prompts)
    generated = [[5, 17, 300], [42, 7, 9], [11, 12, 13]]  # fed after each prompt, one decode step each
    expected = _reference_logits(model, [p + g for p, g in zip(prompts, generated, strict=True)])
    lean = LeanLlama(model)  # fuses the projections in place: the reference ran on the unfused model
    model.set_attn_implementation(ATTENTION)
    fused = _reference_logits(model, [p + g for p, g in zip(prompts, generated, strict=True)])
    cache = SlotCache(model.config, torch.float32, max_rows=4, max_columns=512)
    lengths = [len(p) for p in prompts]
    ids = torch.zeros(len(prompts), max(lengths), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = torch.tensor(p)
    with torch.inference_mode():
        cache.begin_prefill(len(prompts), max(lengths))
        first = lean.prefill(ids, cache, torch.tensor(lengths) - 1)
        cache.end_prefill(lengths)
        steps = [first]
        for t in range(3):
            mask = cache.begin_decode()
            steps.append(lean.decode(torch.tensor([g[t] for g in generated]), cache, mask))
            cache.end_decode()
    for i, p in enumerate(prompts):
        for t in range(4):  # the prefill's last position, then each decoded token's
            torch.testing.assert_close(steps[t][i], expected[i][len(p) - 1 + t], atol=1e-4, rtol=0)
            # The fused weights are views of the same numbers: the transformers forward is unchanged.
            torch.testing.assert_close(fused[i][len(p) - 1 + t], expected[i][len(p) - 1 + t], atol=1e-4, rtol=0)


def test_fused_weights_share_storage_with_the_state_dict() -> None:
    model, _ = load_model("tiny")
    lean = LeanLlama(model)
    attention = model.model.layers[0].self_attn
    q_rows = attention.q_proj.weight.shape[0]
    assert attention.q_proj.weight.data_ptr() == lean.layers[0].qkv.weight.data_ptr()
    with torch.no_grad():
        model.state_dict()["model.layers.0.self_attn.k_proj.weight"].copy_(torch.full_like(attention.k_proj.weight, 3))
    assert bool((lean.layers[0].qkv.weight[q_rows:q_rows + attention.k_proj.weight.shape[0]] == 3).all())


def test_unsupported_models_are_named() -> None:
    model, _ = load_model("tiny")
    model.config.hidden_act = "gelu"
    assert lean_support(model) == "hidden_act 'gelu'"
    with pytest.raises(ValueError, match="hidden_act"):
        LeanLlama(model)


def test_bf16_packed_forward_follows_weight_updates() -> None:
    model, tok = load_model("tiny", dtype=torch.bfloat16)
    # Projections (packed), not norms (read as they are): only a repack makes the change visible.
    changed = {k: v * 1.5 if "proj" in k else v.clone() for k, v in model.state_dict().items()}
    prompts = [tok.encode("the red key opens the box"), tok.encode("go north")]
    params = SamplingParams(max_tokens=6, temperature=0)
    engine = Engine(model, tok, max_batch=4)
    try:
        assert engine._lean is not None and engine._lean.packed == _can_pack(torch.zeros(1, dtype=torch.bfloat16))
        before = [engine.submit(p, params).result(timeout=120).completions[0] for p in prompts]
        engine.update_weights(changed).result(timeout=120)
        after = [engine.submit(p, params).result(timeout=120).completions[0] for p in prompts]
    finally:
        engine.close()
    fresh_model, _ = load_model("tiny", dtype=torch.bfloat16)
    fresh_model.load_state_dict(changed)
    fresh = Engine(fresh_model, tok, max_batch=4)
    try:
        expected = [fresh.submit(p, params).result(timeout=120).completions[0] for p in prompts]
    finally:
        fresh.close()
    assert [c.token_logprobs for c in after] == [c.token_logprobs for c in expected]  # repacked: bit for bit
    assert [c.token_logprobs for c in after] != [c.token_logprobs for c in before]


def test_bf16_lean_logits_are_as_close_to_fp32_as_the_transformers_bf16_forward() -> None:
    fp32, tok = load_model("smollm2")
    hf, _ = load_model("smollm2", dtype=torch.bfloat16)
    lean_model, _ = load_model("smollm2", dtype=torch.bfloat16)
    lean = LeanLlama(lean_model)
    texts = ["The capital of France is Paris, and the capital of Germany is",
             "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
             "Once upon a time, in a small village by the sea, there lived a"]
    errors: dict[str, list[float]] = {"hf": [], "lean": []}
    with torch.inference_mode():
        for text in texts:
            ids = tok.encode(text)
            reference = torch.log_softmax(fp32(torch.tensor([ids])).logits[0, -1], dim=-1)
            top = reference.topk(20).indices  # the tokens that carry the mass
            cache = SlotCache(lean_model.config, torch.bfloat16, max_rows=1, max_columns=128)
            cache.begin_prefill(1, len(ids))
            outputs = {"hf": hf(torch.tensor([ids])).logits[0, -1],
                       "lean": lean.prefill(torch.tensor([ids]), cache, torch.tensor([len(ids) - 1]))[0]}
            for name, logits in outputs.items():
                errors[name].append(float((torch.log_softmax(logits.float(), dim=-1)[top] - reference[top]).abs()
                                          .mean()))
    # bf16 itself moves these log-probs by ~0.03-0.09 (measured); the lean forward rounds in other places, not more.
    assert sum(errors["lean"]) <= 1.5 * sum(errors["hf"]), errors
    assert max(errors["lean"]) <= 0.15, errors


def test_linear_rows_bucket_rounds_to_few_sizes() -> None:
    assert [linear_rows_bucket(r) for r in (1, 8, 9, 64, 65, 127, 128, 129, 145, 1000, 3000)] == \
        [8, 8, 16, 64, 72, 128, 128, 144, 160, 1024, 3072]
    sizes = {linear_rows_bucket(r) for r in range(1, 65537)}
    assert len(sizes) == 8 + 8 * 10  # 8 up to 64, then 8 per power of two up to 2**16
    assert all(r <= linear_rows_bucket(r) <= max(r + 7, r * 1.125) for r in range(1, 65537))


def test_packed_projection_of_bucketed_rows_equals_the_unpadded_one_bit_for_bit() -> None:
    weight = torch.randn(96, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    if not _can_pack(weight):
        pytest.skip("this CPU has no native bf16: projections are not prepacked, nothing is bucketed")
    projection = _Weight(weight, pack=True)
    for shape in [(1, 64), (3, 5, 64), (130, 64), (2, 301, 64)]:
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape))).to(torch.bfloat16)
        unpadded = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, 64), projection.packed, None, "none", [], "")
        assert torch.equal(projection(x), unpadded.view(*shape[:-1], 96))
