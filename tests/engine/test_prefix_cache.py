"""Kept caches: a conversation's next turn resumes from its last turn's keys and values (tiny model, in process).

Each check compares against an engine without kept caches: resuming may change nothing that is generated.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest

from engine.generation import Engine, SamplingParams
from engine.models import load_model

TIMEOUT = 300
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return load_model("tiny")


@pytest.fixture
def plain(model_and_tokenizer) -> Iterator[Engine]:
    eng = Engine(*model_and_tokenizer, max_batch=8, batch_window_s=0.02)
    yield eng
    eng.close()


@pytest.fixture
def keeping(model_and_tokenizer) -> Iterator[Engine]:
    eng = Engine(*model_and_tokenizer, max_batch=8, batch_window_s=0.02, prefix_cache_bytes=64 << 20)
    yield eng
    eng.close()


def _conversation(engine: Engine, task: str) -> list[int]:
    tok = engine.tokenizer
    messages = [{"role": "system", "content": "You are an agent. Call one tool per turn, then answer briefly."},
                {"role": "user", "content": task}]
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


def _observation(engine: Engine, text: str) -> list[int]:
    return engine.tokenizer.encode(f"<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


def _episode(engine: Engine, task: str, turns: int) -> list[tuple[list[int], list[float]]]:
    """`turns` turns of one conversation: each prompt is the last prompt, its reply and an observation."""
    prompt, replies = _conversation(engine, task), []
    for turn in range(turns):
        result = engine.submit(prompt, GREEDY).result(timeout=TIMEOUT)
        reply = result.completions[0]
        replies.append((reply.token_ids, reply.token_logprobs))
        prompt = prompt + reply.token_ids + _observation(engine, f"observation {turn}: the door is locked")
    return replies


def _same(a: list[tuple[list[int], list[float]]], b: list[tuple[list[int], list[float]]]) -> None:
    for (tokens_a, logprobs_a), (tokens_b, logprobs_b) in zip(a, b, strict=True):
        assert tokens_a == tokens_b
        assert all(math.isclose(x, y, abs_tol=1e-4) for x, y in zip(logprobs_a, logprobs_b, strict=True))


def test_each_next_turn_resumes_and_generates_the_same(plain: Engine, keeping: Engine) -> None:
    task = "open the red box in the attic"
    expected = _episode(plain, task, turns=3)
    got = _episode(keeping, task, turns=3)
    _same(expected, got)
    assert plain.stats.resumed_rows == 0 and plain.stats.reused_prefix_tokens == 0
    # Turns 2 and 3 resumed; each reused its last prompt and all of its reply but the last token (never fed).
    first = len(_conversation(keeping, task))
    observations = [len(_observation(keeping, f"observation {t}: the door is locked")) for t in (0, 1)]
    reused_second = first + GREEDY.max_tokens - 1
    reused_third = first + GREEDY.max_tokens + observations[0] + GREEDY.max_tokens - 1
    assert keeping.stats.resumed_rows == 2
    assert keeping.stats.reused_prefix_tokens == reused_second + reused_third
    # Only the tokens after the kept ones were computed: the last reply token and the observation, per turn.
    assert keeping.stats.prefill_tokens == first + sum(1 + n for n in observations)
    assert keeping.stats.prompt_tokens == plain.stats.prompt_tokens


def test_concurrent_conversations_each_resume_their_own(plain: Engine, keeping: Engine) -> None:
    tasks = ["open the red box", "go to the kitchen and take the knife", "read the letter", "climb the stairs"]

    def all_at_once(engine: Engine) -> list[list[tuple[list[int], list[float]]]]:
        prompts = [_conversation(engine, t) for t in tasks]
        replies: list[list[tuple[list[int], list[float]]]] = [[] for _ in tasks]
        for turn in range(2):
            futures = [engine.submit(p, GREEDY) for p in prompts]
            for i, future in enumerate(futures):
                reply = future.result(timeout=TIMEOUT).completions[0]
                replies[i].append((reply.token_ids, reply.token_logprobs))
                prompts[i] = prompts[i] + reply.token_ids + _observation(engine, f"you see {tasks[i]} {turn}")
        return replies

    for expected, got in zip(all_at_once(plain), all_at_once(keeping), strict=True):
        _same(expected, got)
    assert keeping.stats.resumed_rows == len(tasks)


def test_a_weight_update_drops_kept_caches(model_and_tokenizer, keeping: Engine) -> None:
    task = "open the red box"
    prompt = _conversation(keeping, task)
    reply = keeping.submit(prompt, GREEDY).result(timeout=TIMEOUT).completions[0]
    model = model_and_tokenizer[0]
    tensors = {k: v.clone() + 0.01 for k, v in model.state_dict().items()}
    keeping.update_weights(tensors).result(timeout=TIMEOUT)
    keeping.submit(prompt + reply.token_ids + _observation(keeping, "locked"), GREEDY).result(timeout=TIMEOUT)
    assert keeping.stats.resumed_rows == 0  # old weights' keys and values would have been wrong


def test_budget_and_idle_time_bound_what_is_kept(model_and_tokenizer) -> None:
    too_small = Engine(*model_and_tokenizer, max_batch=4, prefix_cache_bytes=1024)
    short_lived = Engine(*model_and_tokenizer, max_batch=4, prefix_cache_bytes=64 << 20, prefix_cache_ttl_s=0.2)
    try:
        for engine, pause in ((too_small, 0.0), (short_lived, 1.0)):
            prompt = _conversation(engine, "open the red box")
            reply = engine.submit(prompt, GREEDY).result(timeout=TIMEOUT).completions[0]
            time.sleep(pause)
            engine.submit(prompt + reply.token_ids + _observation(engine, "locked"), GREEDY).result(timeout=TIMEOUT)
            assert engine.stats.resumed_rows == 0
            assert engine._kept_bytes <= engine.prefix_cache_bytes
    finally:
        too_small.close()
        short_lived.close()


def test_a_prompt_that_only_shares_the_system_prompt_does_not_resume(keeping: Engine) -> None:
    first = keeping.submit(_conversation(keeping, "open the red box"), GREEDY).result(timeout=TIMEOUT)
    keeping.submit(_conversation(keeping, "go to the kitchen"), GREEDY).result(timeout=TIMEOUT)
    assert first.completions[0].token_ids and keeping.stats.resumed_rows == 0


def test_without_the_lean_forward_nothing_is_kept(model_and_tokenizer) -> None:
    engine = Engine(*model_and_tokenizer, max_batch=4, lean=False, prefix_cache_bytes=64 << 20)
    try:
        assert engine.prefix_cache_bytes == 0  # resuming runs the lean forward's extend
        prompt = _conversation(engine, "open the red box")
        reply = engine.submit(prompt, GREEDY).result(timeout=TIMEOUT).completions[0]
        engine.submit(prompt + reply.token_ids + _observation(engine, "locked"), GREEDY).result(timeout=TIMEOUT)
        assert len(reply.token_ids) == GREEDY.max_tokens and engine.stats.resumed_rows == 0
    finally:
        engine.close()
