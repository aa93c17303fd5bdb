"""xgrammar vs llguidance on SmolLM2's tokenizer: the measurement behind llm_server's choice of grammar engine.

    pip install xgrammar==0.2.8   # not a dependency of evolver; without it only llguidance is measured
    python benchmarks/speed/grammar_engines.py [--model smollm2] [--repeats 5]

For each engine, on one CPU thread: the one-off tokenizer set-up, the compile time of a typical
schema (the judge's step-label object, a tool call, a nested object with an array), and the mask
time per token while the matcher walks a valid answer token by token (fill the bitmask, then
accept the token), plus the cost of applying a bitmask to one row of logits. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness import load_1m  # noqa: E402

SCHEMAS: dict[str, tuple[dict[str, Any], Any]] = {
    "judge_labels": ({
        "type": "object",
        "properties": {"steps": {"type": "array", "items": {
            "type": "object",
            "properties": {"step": {"type": "integer"}, "reason": {"type": "string"},
                           "label": {"enum": ["GOOD", "BAD"]}},
            "required": ["step", "reason", "label"], "additionalProperties": False}}},
        "required": ["steps"], "additionalProperties": False,
    }, {"steps": [{"step": 0, "reason": "It searched the right flight first.", "label": "GOOD"},
                  {"step": 1, "reason": "Booked without checking the passenger.", "label": "BAD"}]}),
    "tool_call": ({
        "type": "object",
        "properties": {"name": {"enum": ["search_flight", "book_ticket", "cancel_order"]},
                       "arguments": {"type": "object", "properties": {
                           "origin": {"type": "string"}, "destination": {"type": "string"},
                           "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}},
                           "required": ["origin", "destination"], "additionalProperties": False}},
        "required": ["name", "arguments"], "additionalProperties": False,
    }, {"name": "search_flight", "arguments": {"origin": "Paris", "destination": "Rome", "date": "2025-03-14"}}),
    "person": ({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0},
                       "email": {"type": "string", "format": "email"},
                       "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
                       "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                                    "zip": {"type": "string"}},
                                   "required": ["city"]}},
        "required": ["name", "age", "tags"],
    }, {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math", "poetry"],
        "address": {"city": "London", "zip": "W1"}}),
}


JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _summary(compiles: list[float], masks: list[float], tokens: int) -> dict:
    return {"compile_ms_median": _ms(statistics.median(compiles)), "compile_ms_first": _ms(compiles[0]),
            "mask_us_per_token_median": round(statistics.median(masks) * 1e6, 1),
            "mask_us_per_token_p95": round(sorted(masks)[int(0.95 * len(masks))] * 1e6, 1), "tokens": tokens}


def _llguidance(tokenizer: Any, answer_ids: dict[str, list[int]], repeats: int) -> dict:
    import llguidance
    import torch

    from engine.grammar import ll_tokenizer

    start = time.perf_counter()
    lltok = ll_tokenizer(tokenizer, [tokenizer.eos_token_id])
    setup = time.perf_counter() - start
    out: dict[str, Any] = {"version": importlib.metadata.version("llguidance"), "tokenizer_setup_ms": _ms(setup),
                           "schemas": {}}
    words = (lltok.vocab_size + 31) // 32
    bitmask = torch.full((1, words), -1, dtype=torch.int32)
    for name, (schema, _) in SCHEMAS.items():
        compiles, masks = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
            matcher = llguidance.LLMatcher(lltok, grammar)
            compiles.append(time.perf_counter() - start)
            assert not matcher.is_error(), matcher.get_error()
            for token in answer_ids[name]:
                start = time.perf_counter()
                matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), words * 4)
                ok = matcher.consume_token(token)
                masks.append(time.perf_counter() - start)
                assert ok, f"llguidance rejected a token of the valid {name} answer: {matcher.get_error()}"
        out["schemas"][name] = _summary(compiles, masks, len(answer_ids[name]))
    return out


def _xgrammar(tokenizer: Any, answer_ids: dict[str, list[int]], repeats: int, vocab: int) -> dict:
    import xgrammar as xgr

    start = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    setup = time.perf_counter() - start
    out: dict[str, Any] = {"version": importlib.metadata.version("xgrammar"), "tokenizer_setup_ms": _ms(setup),
                           "schemas": {}}
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    for name, (schema, _) in SCHEMAS.items():
        compiles, masks = [], []
        for _ in range(repeats):
            compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            start = time.perf_counter()
            # The same layout as llguidance's: json.dumps separators, no free whitespace.
            compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                    separators=(", ", ": "))
            matcher = xgr.GrammarMatcher(compiled)
            compiles.append(time.perf_counter() - start)
            for token in answer_ids[name]:
                start = time.perf_counter()
                matcher.fill_next_token_bitmask(bitmask, 0)
                ok = matcher.accept_token(token)
                masks.append(time.perf_counter() - start)
                assert ok, f"xgrammar rejected a token of the valid {name} answer"
        out["schemas"][name] = _summary(compiles, masks, len(answer_ids[name]))
    return out


def _apply_cost(vocab: int, repeats: int = 200) -> float:
    """Microseconds to apply one packed bitmask row to one row of logits (llm_server's own kernel)."""
    import torch

    from engine.grammar import apply_bitmask

    logits = torch.randn(1, vocab)
    bitmask = torch.randint(-2**31, 2**31 - 1, (1, (vocab + 31) // 32), dtype=torch.int32)
    start = time.perf_counter()
    for _ in range(repeats):
        apply_bitmask(logits.clone(), bitmask, [0])
    return round((time.perf_counter() - start) / repeats * 1e6, 1)


def _installed(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import torch
    from transformers import AutoConfig, AutoTokenizer

    from engine.models import resolve_model_dir

    torch.set_num_threads(1)
    model_dir = resolve_model_dir(args.model)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    vocab = int(AutoConfig.from_pretrained(str(model_dir), local_files_only=True).vocab_size)
    answer_ids = {name: tokenizer.encode(json.dumps(answer), add_special_tokens=False)
                  + [tokenizer.eos_token_id] for name, (_, answer) in SCHEMAS.items()}
    result = {"benchmark": "grammar_engines", "model": args.model, "vocab": vocab, "repeats": args.repeats,
              "cpus": os.cpu_count(), "load_1m": load_1m(),
              "llguidance": _llguidance(tokenizer, answer_ids, args.repeats),
              "xgrammar": _xgrammar(tokenizer, answer_ids, args.repeats, vocab) if _installed("xgrammar")
              else "not installed (pip install xgrammar==0.2.8 to compare)",
              "apply_bitmask_us_per_row": _apply_cost(vocab)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
