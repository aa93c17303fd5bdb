"""Grammar masks inside the batching engine, on the tiny model in process: what constrained rows may
generate, how they finish, which logprobs they report, and that free rows in the same batch are untouched."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Iterator

import pytest
import torch

from common.service import ServiceError
from engine.generation import Engine, SamplingParams
from engine.grammar import (
    GrammarCompiler,
    GrammarError,
    GrammarTimeout,
    apply_bitmask,
    choice_grammar,
    json_schema_grammar,
    lark_grammar,
    regex_grammar,
    tool_call_grammar,
)
from engine.models import load_model
from llm_server.structured import compile_grammar

TIMEOUT = 300


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    model, tok = load_model("tiny")
    eng = Engine(model, tok, max_batch=8, batch_window_s=0.05)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def grammars(engine: Engine) -> Iterator[GrammarCompiler]:
    compiler = GrammarCompiler(engine.tokenizer, engine.eos_ids, cache_size=4)
    yield compiler
    compiler.close()


def _prompt(engine: Engine, text: str = "go left") -> list[int]:
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)


def test_apply_bitmask_hand_computed() -> None:
    logits = torch.zeros(3, 40)
    # Line 0 allows tokens 0, 1 and 33 (word 0 = 0b11, word 1 = bit 1); line 1 allows only token 31.
    bitmask = torch.tensor([[0b11, 0b10], [-(2**31), 0]], dtype=torch.int32)
    apply_bitmask(logits, bitmask, [2, 0])
    assert torch.isfinite(logits[2]).nonzero().flatten().tolist() == [0, 1, 33]
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [31]
    assert torch.isfinite(logits[1]).all()  # a row without a line is left alone
    wide = torch.zeros(1, 70)  # logits past the mask's 64 tokens are never allowed
    apply_bitmask(wide, torch.tensor([[-1, -1]], dtype=torch.int32), [0])
    assert torch.isfinite(wide[0]).nonzero().flatten().tolist() == list(range(64))


def test_the_accelerator_path_of_the_mask_equals_the_cpu_path() -> None:
    """A GPU's logits have no numpy view: `mask_rows_with_torch` masks them; here on CPU logits, against numpy's."""
    import numpy as np

    from engine.grammar import mask_rows_with_torch

    bitmask = torch.tensor([[0b11, 0b10], [-(2**31), 0]], dtype=torch.int32)
    for width in (40, 70):  # inside the mask's 64 tokens, and past them
        expected = torch.randn(3, width)
        logits = expected.clone()
        apply_bitmask(expected, bitmask, [2, 0])
        bits = np.unpackbits(bitmask.numpy().astype("<i4").view(np.uint8), axis=-1, bitorder="little")
        mask_rows_with_torch(logits, bits, [2, 0])
        assert torch.equal(logits, expected)


def test_regex_and_choice_rows_match_and_stop(engine: Engine, grammars: GrammarCompiler) -> None:
    regex = grammars.compile(regex_grammar(r"[ab]{2,4}-[0-9]"))
    choice = grammars.compile(choice_grammar(["left", "right", "up"]))
    futures = [engine.submit(_prompt(engine), SamplingParams(max_tokens=30, temperature=1.0, seed=s, grammar=g, n=2))
               for s in range(3) for g in (regex, choice)]
    for future, kind in zip(futures, ["regex", "choice"] * 3, strict=True):
        for completion in future.result(timeout=TIMEOUT).completions:
            # The tiny model is random: only the mask makes these match.
            if kind == "regex":
                assert re.fullmatch(r"[ab]{2,4}-[0-9]", completion.text), completion.text
            else:
                assert completion.text in {"left", "right", "up"}, completion.text
            assert completion.finish_reason == "stop"
            assert len(completion.token_logprobs) == len(completion.token_ids)


def test_length_when_max_tokens_cuts_the_grammar(engine: Engine, grammars: GrammarCompiler) -> None:
    grammar = grammars.compile(regex_grammar(r"x[a-z ]{40,60}y"))
    completion = engine.submit(_prompt(engine), SamplingParams(max_tokens=4, temperature=0, grammar=grammar)) \
        .result(timeout=TIMEOUT).completions[0]
    assert completion.finish_reason == "length" and len(completion.token_ids) == 4
    assert re.fullmatch(r"x[a-z ]*", completion.text), completion.text


def test_logprobs_are_those_of_the_raw_model(engine: Engine, grammars: GrammarCompiler) -> None:
    """The mask changes what is sampled, not the reported logprobs: log_softmax of the unmasked logits."""
    grammar = grammars.compile(json_schema_grammar({"type": "object", "properties": {"go": {"enum": ["left", "up"]}},
                                                    "required": ["go"], "additionalProperties": False}))
    prompt = _prompt(engine)
    result = engine.submit(prompt, SamplingParams(max_tokens=20, temperature=0, grammar=grammar, top_logprobs=2)) \
        .result(timeout=TIMEOUT).completions[0]
    assert json.loads(result.text)["go"] in {"left", "up"}
    ids = torch.tensor([prompt + result.token_ids])
    with torch.no_grad():
        raw = torch.log_softmax(engine.model(ids).logits[0].float(), dim=-1)
    for i, token in enumerate(result.token_ids):
        assert math.isclose(result.token_logprobs[i], float(raw[len(prompt) - 1 + i, token]), abs_tol=1e-4)
        assert result.top_logprobs[i][0][1] == pytest.approx(float(raw[len(prompt) - 1 + i].max()), abs=1e-4)
    # A random model puts little mass on the forced JSON tokens: renormalised logprobs would be ~0.
    assert min(result.token_logprobs) < -1.0


def test_constrained_and_free_rows_share_decode_steps(engine: Engine, grammars: GrammarCompiler) -> None:
    grammar = grammars.compile(regex_grammar(r"(left|right)( (left|right)){5,8}"))
    free_prompt = _prompt(engine, "open the box with the red key now")
    greedy = SamplingParams(max_tokens=12, temperature=0)
    alone = engine.submit(free_prompt, greedy).result(timeout=TIMEOUT).completions[0]
    before = engine.stats.mixed_decode_steps, engine.stats.constrained_rows
    futures = [engine.submit(_prompt(engine), SamplingParams(max_tokens=40, temperature=0, grammar=grammar)),
               engine.submit(free_prompt, greedy)]
    constrained, free = (f.result(timeout=TIMEOUT).completions[0] for f in futures)
    assert engine.stats.mixed_decode_steps > before[0]
    assert engine.stats.constrained_rows == before[1] + 1
    assert re.fullmatch(r"(left|right)( (left|right)){5,8}", constrained.text), constrained.text
    assert free.token_ids == alone.token_ids  # the neighbour's mask never touches this row


def test_tool_call_grammar_forces_one_named_call(engine: Engine, grammars: GrammarCompiler) -> None:
    from llm_server.tools import parse_tool_calls

    tools = [{"type": "function", "function": {"name": "move", "parameters": {
        "type": "object", "properties": {"to": {"enum": ["left", "right"]}}, "required": ["to"]}}},
        {"type": "function", "function": {"name": "wait", "parameters": {"type": "object", "properties": {}}}}]
    grammar = grammars.compile(tool_call_grammar(tools, "move"))
    # The grammar admits extra string-valued keys, and the random model wanders into them for some seeds
    # (3 of seeds 0-19 run past 60 tokens): seed 0 completes the call.
    text = engine.submit(_prompt(engine), SamplingParams(max_tokens=60, temperature=0.8, seed=0, grammar=grammar)) \
        .result(timeout=TIMEOUT).completions[0].text
    content, calls = parse_tool_calls(text)
    assert content == "" and [c["function"]["name"] for c in calls] == ["move"]
    assert json.loads(calls[0]["function"]["arguments"])["to"] in {"left", "right"}
    with pytest.raises(GrammarError, match="'jump'"):
        tool_call_grammar(tools, "jump")


def test_compiler_caches_and_names_errors(engine: Engine, grammars: GrammarCompiler) -> None:
    first = grammars.compile(regex_grammar("[0-9]+"))
    hits = grammars.stats.cache_hits
    assert grammars.compile(regex_grammar("[0-9]+")) is first and grammars.stats.cache_hits == hits + 1
    for i in range(5):  # cache_size=4: the oldest entry is evicted
        grammars.compile(regex_grammar(f"z{i}"))
    assert grammars.stats.cached == 4
    assert grammars.compile(regex_grammar("[0-9]+")) is not first
    with pytest.raises(GrammarError, match="unclosed group"):
        grammars.compile(regex_grammar("(("))
    with pytest.raises(GrammarError, match="Invalid type: strin"):
        grammars.compile(json_schema_grammar({"type": "strin"}))
    with pytest.raises(GrammarError, match="unknown name"):
        grammars.compile(lark_grammar("start: foo"))
    with pytest.raises(GrammarError, match="non-empty"):
        choice_grammar([])


def test_slow_compile_times_out_then_lands_in_the_cache(engine: Engine) -> None:
    slow = GrammarCompiler(engine.tokenizer, engine.eos_ids, timeout_s=0.001)
    # Thousands of alternatives: far more than a 1 ms limit to build.
    grammar = choice_grammar([f"option number {i} of many" for i in range(3000)])
    with pytest.raises(GrammarTimeout, match="longer than 0.001 s"):
        slow.compile(grammar)
    assert slow.stats.timeouts == 1
    deadline = time.monotonic() + TIMEOUT
    while slow.stats.compiles == 0 and time.monotonic() < deadline:  # the build goes on off the caller's thread
        time.sleep(0.05)
    assert slow.compile(grammar).template is not None and slow.stats.cache_hits == 1
    assert slow.stats.compiles == 1
    # Over HTTP the same is a 400 naming the field (llm_server.structured maps it).
    other = choice_grammar([f"another option {i}" for i in range(3000)])
    with pytest.raises(ServiceError) as info:
        asyncio.run(compile_grammar(slow, "structured_outputs", other))
    assert info.value.status == 400 and info.value.code == "grammar_too_complex"
    assert info.value.message.startswith("structured_outputs: the constraint took longer than 0.001 s")
    slow.close()
