"""`python -m llm_server --model smollm2` over real HTTP, through the official openai client.

One server for the whole run (session fixture); max_tokens stays small: ~10-25 tokens/s on 2 cores.
"""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from tests.helpers import ServiceProcess

pytestmark = pytest.mark.slow


def _client(server: ServiceProcess) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=300, max_retries=0)


def _stats(server: ServiceProcess) -> dict:
    return httpx.get(f"{server.url}/v1/stats", timeout=10).json()


def test_capital_of_france(smollm2_server: ServiceProcess) -> None:
    client = _client(smollm2_server)
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    response = client.chat.completions.create(
        model="smollm2", temperature=0, max_tokens=12,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in one word."}])
    assert "Paris" in response.choices[0].message.content
    assert response.usage.completion_tokens == len(response.choices[0].model_extra["token_ids"])
    assert response.usage.prompt_tokens == len(response.model_extra["prompt_token_ids"])


async def test_concurrent_requests_are_batched(smollm2_server: ServiceProcess) -> None:
    client = AsyncOpenAI(base_url=f"{smollm2_server.url}/v1", api_key="unused", timeout=300, max_retries=0)
    questions = ["Name a colour.", "Name a fruit.", "Name an animal.", "Name a country.", "Name a city.",
                 "Name a planet.", "Name a tree.", "Name a metal."]
    before = _stats(smollm2_server)
    responses = await asyncio.gather(*[
        client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": q}],
                                       max_tokens=8, temperature=0) for q in questions])
    after = _stats(smollm2_server)
    await client.close()
    generated = sum(r.usage.completion_tokens for r in responses)
    prefills = after["prefill_batches"] - before["prefill_batches"]
    decode_steps = after["decode_steps"] - before["decode_steps"]
    assert after["requests"] - before["requests"] == len(questions)
    assert after["generated_tokens"] - before["generated_tokens"] == generated
    # Unbatched, 8 requests would need 8 prefills and (generated - 8) decode steps.
    assert prefills < len(questions)
    assert decode_steps < generated - len(questions)
    assert after["max_rows_in_batch"] >= 2


def test_token_ids_decode_to_text_and_logprobs(smollm2_server: ServiceProcess) -> None:
    from transformers import AutoTokenizer

    from engine.models import resolve_model_dir

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_dir("smollm2")))
    client = _client(smollm2_server)
    messages = [{"role": "user", "content": "Write one short sentence about the sea."}]
    response = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=10, temperature=0,
                                              logprobs=True, top_logprobs=2)
    choice = response.choices[0]
    token_ids = choice.model_extra["token_ids"]
    assert tokenizer.decode(token_ids, skip_special_tokens=True) == choice.message.content
    prompt_ids = response.model_extra["prompt_token_ids"]
    assert tokenizer.decode(prompt_ids).endswith("<|im_start|>assistant\n")
    logprobs = choice.model_extra["token_logprobs"]
    assert len(logprobs) == len(token_ids) and all(math.isfinite(lp) and lp <= 0 for lp in logprobs)
    assert [c.logprob for c in choice.logprobs.content] == logprobs
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob >= c.logprob - 1e-6
               for c in choice.logprobs.content)

    # Greedy is deterministic, and /v1/completions continues exact token ids (token in, token out).
    again = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=10, temperature=0)
    assert again.choices[0].model_extra["token_ids"] == token_ids
    continued = client.completions.create(model="smollm2", prompt=prompt_ids, max_tokens=10, temperature=0)
    assert continued.model_extra["prompt_token_ids"] == prompt_ids
    assert continued.choices[0].model_extra["token_ids"] == token_ids
    via_extension = httpx.post(f"{smollm2_server.url}/v1/completions", timeout=300, json={
        "model": "smollm2", "prompt_token_ids": prompt_ids + token_ids[:4], "max_tokens": len(token_ids) - 4,
        "temperature": 0}).json()
    assert via_extension["choices"][0]["token_ids"] == token_ids[4:]


def test_seed_makes_sampling_reproducible(smollm2_server: ServiceProcess) -> None:
    client = _client(smollm2_server)
    messages = [{"role": "user", "content": "Tell me a word."}]

    def sample(seed: int) -> list[list[int]]:
        response = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=8, temperature=1.0,
                                                  n=2, seed=seed)
        assert response.model_extra["policy_version"] == 0
        return [c.model_extra["token_ids"] for c in response.choices]

    first = sample(11)
    assert sample(11) == first
    assert sample(12) != first
