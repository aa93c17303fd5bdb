"""A bf16 in-process policy: rollouts from bf16 weights, log-probs near fp32 ones, and never reused as old ones."""

from __future__ import annotations

import asyncio

import torch

from common.models import load_model
from trainer.policy import InProcessPolicy, Sampling


def _fp32_logprobs(model: torch.nn.Module, prompt: list[int], response: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(response)[:, None])[:, 0]


def test_bf16_policy_generates_near_fp32_logprobs_and_is_not_exact() -> None:
    model, tok = load_model("tiny")
    prompt = tok.encode("go left then right", add_special_tokens=False)
    fp32 = InProcessPolicy(model, tok, max_batch=4)
    bf16 = InProcessPolicy(model, tok, max_batch=4, dtype=torch.bfloat16)
    try:
        assert fp32.exact_logprobs and not bf16.exact_logprobs
        assert next(model.parameters()).dtype == torch.float32  # the training model is untouched
        out = asyncio.run(bf16.generate(prompt, Sampling(max_tokens=16, temperature=1.0, seed=3)))
        reference = _fp32_logprobs(model, prompt, out.token_ids)
        delta = (torch.tensor(out.logprobs) - reference).abs()
        assert out.token_ids and float(delta.mean()) <= 0.05, delta
        exact = asyncio.run(fp32.generate(prompt, Sampling(max_tokens=16, temperature=1.0, seed=3)))
        assert float((torch.tensor(exact.logprobs) - _fp32_logprobs(model, prompt, exact.token_ids)).abs().max()) <= 1e-3
    finally:
        asyncio.run(fp32.aclose())
        asyncio.run(bf16.aclose())
