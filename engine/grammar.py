"""Grammar-constrained decoding with llguidance: grammars from JSON schemas, regexes, choices and Lark/GBNF
text, compiled once per tokenizer and cached, and a per-row matcher that yields a token bitmask.

Why llguidance (measured by `benchmarks/speed/grammar_engines.py` on SmolLM2's 49k vocabulary): it has no
dependencies (xgrammar pulls in triton and apache-tvm-ffi), its schema compile is sub-millisecond to a few
ms, and a mask costs tens of microseconds per token on CPU, so a constrained row costs about as much as a
free one next to a forward pass.

The engine thread only copies a compiled template matcher (cheap) and asks it for masks; compilation
happens on a separate thread pool with a time limit (`GrammarCompiler.compile`), so a pathological schema
costs its own request a 400 and never stalls the running batch.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

# JSON as `json.dumps` writes it: small models follow this layout, and without free whitespace they
# cannot pad an answer with endless newlines until max_tokens.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ENGINE = "llguidance"


class GrammarError(ValueError):
    """The constraint cannot be compiled; the message names what is wrong (a 400 for the client)."""


class GrammarTimeout(GrammarError):
    """Compilation took longer than the compiler's time limit."""


def json_schema_grammar(schema: Any) -> str:
    """llguidance grammar text for a JSON schema (a dict, or `True` for any JSON value)."""
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
    try:
        return _llg().LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
    except (ValueError, TypeError) as exc:
        raise GrammarError(f"invalid JSON schema: {exc}") from None


def regex_grammar(pattern: str) -> str:
    return _llg().LLMatcher.grammar_from_regex(pattern)


def choice_grammar(choices: list[str]) -> str:
    """Exactly one of `choices`, verbatim."""
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise GrammarError("choice must be a non-empty list of non-empty strings")
    return _llg().LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))


def lark_grammar(text: str) -> str:
    """A Lark grammar (llguidance's dialect) or a llama.cpp GBNF grammar, as vLLM's `grammar` field takes."""
    from llguidance._grammar_from import grammar_from

    try:
        return grammar_from("grammar", text)
    except ValueError as exc:
        raise GrammarError(f"invalid grammar: {exc}") from None


def tool_call_grammar(tools: list[dict[str, Any]], name: str | None) -> str:
    """One Hermes `<tool_call>{"name", "arguments"}</tool_call>` block (what the chat template asks for and
    `llm_server.tools` parses), restricted to `name` when one tool is forced.

    One call, not "one or more": given the choice, small models repeat the same call until max_tokens.
    """
    calls = []
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        if name is not None and function.get("name") != name:
            continue
        parameters = function.get("parameters") or {"type": "object"}
        calls.append({"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                      "properties": {"name": {"const": function.get("name")}, "arguments": parameters}})
    if not calls:
        raise GrammarError(f"tool_choice names {name!r}, which is not among the request's tools")
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    call = "%json " + json.dumps({**schema, "x-guidance": JSON_LAYOUT})
    lark = f'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: {call}\n'
    return _llg().LLMatcher.grammar_from_lark(lark)


def ll_tokenizer(tokenizer: Any, eos_ids: list[int]) -> Any:
    """llguidance's view of a HF fast tokenizer, checked to decode a sample exactly as HF does."""
    import llguidance

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    spec.pop("padding", None)
    spec.pop("truncation", None)
    # Tokenizers converted from GGUF (SmolLM2's) chain ByteFallback/Fuse/Replace before ByteLevel in their
    # decoder; llguidance then reads the tokens as sentencepiece pieces and every mask is wrong. The
    # pre-tokenizer says how token strings map to bytes, so a ByteLevel one gets the plain ByteLevel decoder.
    decoder = spec.get("decoder") or {}
    if _has_byte_level(spec.get("pre_tokenizer")) and decoder.get("type") == "Sequence":
        spec["decoder"] = next(d for d in decoder["decoders"] if d.get("type") == "ByteLevel") \
            if any(d.get("type") == "ByteLevel" for d in decoder["decoders"]) else decoder
    lltok = llguidance.LLTokenizer(json.dumps(spec), eos_token=eos_ids)
    sample = 'Grammar check: {"key": [1, 2.5, "é ü"], "ok": true}\n\tdone'
    ids = tokenizer.encode(sample, add_special_tokens=False)
    if lltok.decode_str(ids) != tokenizer.decode(ids):
        raise ValueError("llguidance decodes this tokenizer's tokens differently from transformers: structured "
                         "outputs are not available for this model")
    return lltok


def _has_byte_level(pre_tokenizer: dict | None) -> bool:
    if not pre_tokenizer:
        return False
    if pre_tokenizer.get("type") == "ByteLevel":
        return True
    return any(_has_byte_level(p) for p in pre_tokenizer.get("pretokenizers", []))


@dataclass
class CompiledGrammar:
    """A validated grammar bound to one tokenizer; `matcher()` gives each row its own state."""

    template: Any  # llguidance.LLMatcher in its start state, never advanced itself
    compile_s: float
    vocab_size: int  # tokens the masks cover; logits past it are always masked

    def matcher(self) -> Any:
        return self.template.deep_copy()


@dataclass
class CompilerStats:
    compiles: int = 0
    cache_hits: int = 0
    errors: int = 0
    timeouts: int = 0
    compile_seconds: float = 0.0
    cached: int = 0


@dataclass
class _Pending:
    future: concurrent.futures.Future
    timed_out: bool = field(default=False)


class GrammarCompiler:
    """Compiles grammar text for one tokenizer on its own threads, with an LRU cache and a time limit."""

    def __init__(self, tokenizer: Any, eos_ids: list[int], *, cache_size: int = 256, timeout_s: float = 10.0,
                 threads: int = 2) -> None:
        # Two builders: one slow schema (up to the time limit) does not make every other new schema wait.
        # llguidance releases the GIL while it builds, so they run beside the engine thread.
        self.tokenizer = ll_tokenizer(tokenizer, eos_ids)
        self.vocab_size = int(self.tokenizer.vocab_size)
        self.cache_size, self.timeout_s = cache_size, timeout_s
        self.stats = CompilerStats()
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grammar")

    def compile(self, grammar: str) -> CompiledGrammar:
        """The compiled grammar (from the cache when seen before); GrammarError if invalid or too slow.

        Blocks the calling thread up to the time limit: call it off the engine thread (the HTTP layer
        uses `asyncio.to_thread`). A compile that times out keeps running in the background and lands in
        the cache if it ever finishes; until then the same grammar is refused at once.
        """
        with self._lock:
            hit = self._cache.get(grammar)
            if hit is not None:
                self._cache.move_to_end(grammar)
                self.stats.cache_hits += 1
                return hit
            pending = self._pending.get(grammar)
            started = pending is None
            if pending is None:
                pending = _Pending(self._pool.submit(self._build, grammar))
                self._pending[grammar] = pending
            elif pending.timed_out:
                self.stats.timeouts += 1
                raise GrammarTimeout(self._timeout_message())
        if started:  # outside the lock: a compile that already finished runs the callback right here
            pending.future.add_done_callback(lambda f, g=grammar: self._landed(g, f))
        try:
            return pending.future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            with self._lock:
                pending.timed_out = True
                self.stats.timeouts += 1
            raise GrammarTimeout(self._timeout_message()) from None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _timeout_message(self) -> str:
        return (f"the constraint took longer than {self.timeout_s:g} s to compile; simplify the schema, regex "
                "or grammar (fewer alternatives, bounded repetitions)")

    def _build(self, grammar: str) -> CompiledGrammar:
        llg = _llg()
        start = time.perf_counter()
        template = llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if template.is_error():
            raise GrammarError(_first_line_block(template.get_error()))
        return CompiledGrammar(template, time.perf_counter() - start, self.vocab_size)

    def _landed(self, grammar: str, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._pending.pop(grammar, None)
            if future.cancelled():
                return
            error = future.exception()
            if error is not None:
                self.stats.errors += 1
                return
            compiled = future.result()
            self.stats.compiles += 1
            self.stats.compile_seconds += compiled.compile_s
            self._cache[grammar] = compiled
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            self.stats.cached = len(self._cache)


class MaskBatch:
    """A reusable packed bitmask for the engine: one int32 word per 32 tokens, one line per constrained row."""

    def __init__(self, rows: int, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self.bitmask = torch.zeros((rows, self.words), dtype=torch.int32)

    def fill(self, line: int, matcher: Any) -> None:
        """Write `matcher`'s allowed next tokens into line `line` (the matcher reports errors via is_error)."""
        row = self.bitmask[line]
        matcher.unsafe_compute_mask_ptr(row.data_ptr(), self.words * 4)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Set logits[rows[k], t] to -inf where bit t of bitmask[k] is 0 (in place); tokens past the mask too.

    Bit t of a packed line is bit t % 32 of word t // 32; as little-endian bytes that is bit t % 8 of
    byte t // 8, the order numpy's little-endian unpackbits yields. numpy on purpose: small torch ops wake
    torch's worker threads, which costs milliseconds on a loaded CPU (measured), numpy runs inline.
    """
    words = bitmask[:len(rows)].numpy().astype("<i4", copy=False)
    bits = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")
    if logits.device.type != "cpu":  # an accelerator's logits: no numpy view of them
        mask_rows_with_torch(logits, bits, rows)
        return
    values = logits.numpy()
    covered = min(values.shape[-1], bits.shape[-1])
    for line, row in enumerate(rows):
        target = values[row]
        target[:covered][bits[line, :covered] == 0] = -np.inf
        target[covered:] = -np.inf


def mask_rows_with_torch(logits: torch.Tensor, bits: np.ndarray, rows: list[int]) -> None:
    """`apply_bitmask` for logits on any device (a GPU's): one masked write from the unpacked bits [lines, bits]."""
    vocab = logits.shape[-1]
    allowed = np.zeros((len(rows), vocab), dtype=bool)
    covered = min(vocab, bits.shape[-1])
    allowed[:, :covered] = bits[:, :covered] == 1
    index = torch.tensor(rows, device=logits.device)
    forbidden = torch.from_numpy(~allowed).to(logits.device)
    logits[index] = logits[index].masked_fill(forbidden, float("-inf"))


def _first_line_block(message: str) -> str:
    """llguidance errors end with a caret diagram of the grammar; the client needs the sentence before it."""
    return message.strip().split("\n   1 |")[0].strip()


def _llg() -> Any:
    import llguidance

    return llguidance
