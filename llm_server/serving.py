"""What the routes share: the served model, request checks, prompt rendering, generation and the response
shapes of the OpenAI-compatible routes (`llm_server.app`) and the gateway (`llm_server.gateway`)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from common.service import ServiceError
from engine.generation import Completion, Engine, EngineClosed, GenerationResult, SamplingParams
from engine.grammar import CompiledGrammar, GrammarCompiler
from llm_server.protocol import ROLES, ChatCompletionRequest, CompletionRequest, _SamplingFields
from llm_server.settings import LLMServerSettings
from llm_server.structured import capabilities, compile_grammar, requested_grammar
from llm_server.tools import parse_tool_calls, random_call_id


class ServedModel:
    """What the routes need: the engine, its tokenizer, the public name and the limits."""

    def __init__(self, engine: Engine, tokenizer: Any, name: str, settings: LLMServerSettings,
                 grammars: GrammarCompiler | None = None) -> None:
        self.engine, self.tokenizer, self.name, self.settings = engine, tokenizer, name, settings
        self.grammars = grammars  # None: this model's tokenizer has no structured outputs
        self.context_length = engine.context_length
        self.vocab_size = len(tokenizer)
        self.created = int(time.time())
        self.weight_uploads = 0  # updates whose weights came as a request's body (a trainer on another node)


# ---- request checks and prompts ---------------------------------------------------------------
def check_model(served: ServedModel, model: str) -> None:
    if model != served.name:
        raise ServiceError(404, "model_not_found",
                           f"model {model!r} is not served here; this server serves {served.name!r}",
                           {"served": [served.name]})


def check_token_ids(served: ServedModel, ids: list[int], field: str) -> None:
    bad = [t for t in ids if not 0 <= t < served.vocab_size]
    if bad:
        raise ServiceError(400, "invalid_prompt", f"{field} must be in [0, {served.vocab_size}); got {bad[:5]}")


def check_common(served: ServedModel, request: _SamplingFields) -> None:
    check_model(served, request.model)
    problems = request.unsupported()
    if problems:
        raise ServiceError(400, "unsupported_parameter", "not supported: " + "; ".join(problems))
    if request.n > served.engine.max_batch:
        raise ServiceError(400, "n_too_large", f"n={request.n} exceeds the server's max batch of "
                                               f"{served.engine.max_batch} rows (--max-batch)")


async def constraint(served: ServedModel, request: _SamplingFields, chat: bool) -> CompiledGrammar | None:
    grammar = requested_grammar(request, chat=chat)
    return None if grammar is None else await compile_grammar(served.grammars, *grammar)


def structured_stats(served: ServedModel) -> dict | None:
    if served.grammars is None:
        return None
    s, g = served.engine.stats, served.grammars.stats
    return {**capabilities(), "constrained_rows": s.constrained_rows, "constrained_tokens": s.constrained_tokens,
            "mixed_decode_steps": s.mixed_decode_steps, "mask_seconds": round(s.mask_seconds, 6),
            "mask_us_per_token": round(1e6 * s.mask_seconds / s.constrained_tokens, 1) if s.constrained_tokens
            else None, "aborted_rows": s.grammar_aborts, "grammars_compiled": g.compiles,
            "grammar_cache_hits": g.cache_hits, "grammars_cached": g.cached, "grammar_errors": g.errors,
            "grammar_timeouts": g.timeouts, "compile_seconds": round(g.compile_seconds, 6)}


def chat_prompt_ids(served: ServedModel, request: ChatCompletionRequest) -> list[int]:
    return render_chat(served, request.messages, request.tools, request.add_generation_prompt,
                        request.continue_final_message)


def render_chat(served: ServedModel, raw_messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                add_generation_prompt: bool, continue_final_message: bool) -> list[int]:
    """Token ids of the messages rendered with the served chat template (the exact prompt a chat call uses)."""
    text = render_text(served, raw_messages, tools, add_generation_prompt, continue_final_message)
    return served.tokenizer.encode(text, add_special_tokens=False)


def render_text(served: ServedModel, raw_messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                add_generation_prompt: bool, continue_final_message: bool = False) -> str:
    """The messages rendered with the served chat template, as text."""
    for i, message in enumerate(raw_messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise ServiceError(400, "invalid_message", f"messages[{i}].role must be one of {sorted(ROLES)}, "
                                                       f"got {role!r}")
    messages = [normalise_message(m) for m in raw_messages]
    try:
        return served.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message)
    except Exception as exc:  # jinja errors: the messages do not fit the template
        raise ServiceError(400, "invalid_messages", f"the chat template cannot render these messages: {exc}") from None


def normalise_message(message: dict[str, Any]) -> dict[str, Any]:
    """`developer` is OpenAI's newer name for `system`; the templates know only `system`."""
    out = dict(message)
    if out.get("role") == "developer":
        out["role"] = "system"
    if out.get("content") is None:
        out["content"] = ""
    return out


def completion_prompt_ids(served: ServedModel, request: CompletionRequest) -> list[int]:
    prompt: Any = request.prompt
    if request.prompt_token_ids is not None:
        if prompt not in (None, "", []):
            raise ServiceError(400, "invalid_prompt", "give either prompt or prompt_token_ids, not both")
        prompt = request.prompt_token_ids
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) != 1:
            raise ServiceError(400, "invalid_prompt", f"one prompt per request (got {len(prompt)}); "
                                                      "send concurrent requests instead: they are batched")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = served.tokenizer.encode(prompt, add_special_tokens=False)
    elif isinstance(prompt, list):
        ids = prompt
        check_token_ids(served, ids, "prompt token ids")
    else:
        ids = []
    if not ids:
        raise ServiceError(400, "invalid_prompt", "the prompt is empty: give prompt (text or token ids) or "
                                                  "prompt_token_ids")
    return ids


async def generate(served: ServedModel, request: _SamplingFields, prompt_ids: list[int], max_tokens: int | None,
                    top_logprobs: int, grammar: CompiledGrammar | None = None) -> GenerationResult:
    context = served.context_length
    room = context - len(prompt_ids)
    if room <= 0:
        raise ServiceError(400, "context_length_exceeded",
                           f"the prompt is {len(prompt_ids)} tokens, {1 - room} more than fit: the model's context "
                           f"is {context} tokens and at least 1 must be left to generate",
                           {"prompt_tokens": len(prompt_ids), "context_length": context})
    if max_tokens is None:
        max_tokens = min(served.settings.default_max_tokens, room)
    elif max_tokens > room:
        raise ServiceError(400, "context_length_exceeded",
                           f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceed the model's context "
                           f"of {context} tokens by {max_tokens - room}; lower max_tokens to at most {room}",
                           {"prompt_tokens": len(prompt_ids), "max_tokens": max_tokens, "context_length": context})
    if request.n * max_tokens > served.settings.max_request_tokens:
        raise ServiceError(400, "request_too_large",
                           f"n * max_tokens = {request.n * max_tokens} exceeds this server's limit of "
                           f"{served.settings.max_request_tokens} tokens per request; lower n or max_tokens")
    stop_ids = tuple(request.stop_token_ids or ())
    if any(not 0 <= t < served.vocab_size for t in stop_ids):
        raise ServiceError(400, "invalid_stop_token_ids", f"stop_token_ids must be in [0, {served.vocab_size})")
    params = SamplingParams(max_tokens=max_tokens, temperature=request.temperature, top_p=request.top_p,
                            stop=request.stop_strings(), stop_token_ids=stop_ids, seed=request.seed,
                            top_logprobs=top_logprobs, n=request.n, grammar=grammar, ignore_eos=request.ignore_eos)
    try:
        return await asyncio.wrap_future(served.engine.submit(prompt_ids, params))
    except ValueError as exc:
        raise ServiceError(400, "invalid_request", str(exc)) from None
    except EngineClosed:
        raise ServiceError(503, "shutting_down", "the model server is shutting down; retry elsewhere") from None


# ---- responses ----------------------------------------------------------------------------------
def envelope(kind: str, prefix: str, served: ServedModel, result: GenerationResult, choices: list[dict]) -> dict:
    completion_tokens = sum(len(c.token_ids) for c in result.completions)
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": served.name,
        "choices": choices,
        "usage": {"prompt_tokens": len(result.prompt_token_ids), "completion_tokens": completion_tokens,
                  "total_tokens": len(result.prompt_token_ids) + completion_tokens},
        "prompt_token_ids": result.prompt_token_ids,
        "policy_version": result.policy_version,
    }


def _token_text(served: ServedModel, token_id: int) -> str:
    return served.tokenizer.decode([token_id])


def chat_choice(served: ServedModel, index: int, completion: Completion, logprobs: bool, parse_tools: bool,
                call_id: Callable[[int], str] = random_call_id) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": completion.text}
    finish_reason = completion.finish_reason
    if parse_tools:
        content, calls = parse_tool_calls(completion.text, call_id)
        if calls:
            message = {"role": "assistant", "content": content or None, "tool_calls": calls}
            finish_reason = "tool_calls"
    choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": finish_reason, "logprobs": None,
                              "token_ids": completion.token_ids, "token_logprobs": completion.token_logprobs}
    if logprobs:
        content_logprobs = []
        for position, (token_id, logprob) in enumerate(zip(completion.token_ids, completion.token_logprobs,
                                                           strict=True)):
            text = _token_text(served, token_id)
            alternatives = completion.top_logprobs[position] if completion.top_logprobs else []
            content_logprobs.append({
                "token": text, "logprob": logprob, "bytes": list(text.encode()),
                "top_logprobs": [{"token": (t := _token_text(served, i)), "logprob": lp, "bytes": list(t.encode())}
                                 for i, lp in alternatives]})
        choice["logprobs"] = {"content": content_logprobs}
    return choice


def completion_choice(served: ServedModel, index: int, completion: Completion, logprobs: bool) -> dict:
    choice: dict[str, Any] = {"index": index, "text": completion.text, "finish_reason": completion.finish_reason,
                              "logprobs": None, "token_ids": completion.token_ids,
                              "token_logprobs": completion.token_logprobs}
    if logprobs:
        tokens = [_token_text(served, t) for t in completion.token_ids]
        offsets, total = [], 0
        for token in tokens:
            offsets.append(total)
            total += len(token)
        choice["logprobs"] = {
            "tokens": tokens, "token_logprobs": completion.token_logprobs, "text_offset": offsets,
            "top_logprobs": [{_token_text(served, i): lp for i, lp in alts} for alts in completion.top_logprobs]
            if completion.top_logprobs else None,
        }
    return choice

