"""The OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions, plus
/v1/weights (trainer weight sync) and /v1/stats (batching counters, also in /metrics).
Structured outputs (response_format, structured_outputs, forced tool_choice): `llm_server.structured`."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request

from common.service import ServiceError, create_app, from_app_state
from engine.generation import Completion, Engine, EngineClosed, GenerationResult, SamplingParams
from engine.grammar import CompiledGrammar, GrammarCompiler
from llm_server.metrics import EngineCollector
from llm_server.protocol import (
    ROLES,
    WEIGHTS_UPLOAD,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    WeightUpdateRequest,
    WeightUpdateResponse,
    _SamplingFields,
)
from llm_server.settings import LLMServerSettings
from llm_server.structured import capabilities, compile_grammar, requested_grammar
from llm_server.tools import parse_tool_calls
from llm_server.weights import allowed_path, read_state_dict, read_state_dict_bytes


class ServedModel:
    """What the routes need: the engine, its tokenizer, the public name and the limits."""

    def __init__(self, engine: Engine, tokenizer: Any, name: str, settings: LLMServerSettings,
                 grammars: GrammarCompiler | None = None) -> None:
        self.engine, self.tokenizer, self.name, self.settings = engine, tokenizer, name, settings
        self.grammars = grammars  # None: this model's tokenizer has no structured outputs
        self.context_length = engine.context_length
        self.vocab_size = len(tokenizer)
        self.created = int(time.time())


def build_app(served: ServedModel) -> FastAPI:
    app = create_app("llm_server", description="OpenAI-compatible transformers model server (CPU), with token ids",
                      max_body_bytes=served.settings.max_body_bytes,
                      body_limits={WEIGHTS_UPLOAD: served.settings.max_weights_bytes})
    app.state.served = served
    app.state.metrics_registry.register(EngineCollector(served.engine))
    for router in (openai, vllm, trainer, service):
        app.include_router(router)
    return app


# ---- routes -------------------------------------------------------------------------------------
Served = Annotated[ServedModel, Depends(from_app_state("served"))]

openai = APIRouter(tags=["openai"])


@openai.get("/v1/models")
async def models(served: Served) -> dict:
    return {"object": "list", "data": [{
        "id": served.name, "object": "model", "created": served.created, "owned_by": "evolver",
        "max_model_len": served.context_length, "policy_version": served.engine.policy_version,
        "structured_outputs": capabilities() if served.grammars is not None else None}]}


@openai.post("/v1/chat/completions")
async def chat_completions(request: ChatCompletionRequest, served: Served) -> dict:
    _check_common(served, request)
    grammar = await _constraint(served, request, chat=True)
    prompt_ids = _chat_prompt_ids(served, request)
    max_tokens = request.max_completion_tokens or request.max_tokens
    top = (request.top_logprobs or 0) if request.logprobs else 0
    result = await _generate(served, request, prompt_ids, max_tokens, top, grammar)
    parse_tools = bool(request.tools) and request.tool_choice != "none"
    choices = [_chat_choice(served, i, c, request.logprobs, parse_tools) for i, c in enumerate(result.completions)]
    return _envelope("chat.completion", "chatcmpl", served, result, choices)


@openai.post("/v1/completions")
async def completions(request: CompletionRequest, served: Served) -> dict:
    _check_common(served, request)
    if request.echo:
        raise ServiceError(400, "unsupported_parameter", "echo=true is not supported")
    if request.best_of not in (None, request.n):
        raise ServiceError(400, "unsupported_parameter", "best_of is not supported (use n)")
    grammar = await _constraint(served, request, chat=False)
    prompt_ids = _completion_prompt_ids(served, request)
    top = request.logprobs or 0
    result = await _generate(served, request, prompt_ids, request.max_tokens, top, grammar)
    choices = [_completion_choice(served, i, c, request.logprobs is not None)
               for i, c in enumerate(result.completions)]
    return _envelope("text_completion", "cmpl", served, result, choices)


vllm = APIRouter(tags=["vllm"])


@vllm.post("/tokenize")
async def tokenize(request: TokenizeRequest, served: Served) -> dict:
    _check_model(served, request.model)
    if (request.prompt is None) == (request.messages is None):
        raise ServiceError(400, "invalid_request", "give exactly one of prompt or messages")
    if request.messages is not None:
        tokens = _render_chat(served, request.messages, request.tools, request.add_generation_prompt,
                              request.continue_final_message)
    else:
        tokens = served.tokenizer.encode(request.prompt, add_special_tokens=False)
    return {"tokens": tokens, "count": len(tokens), "max_model_len": served.context_length}


@vllm.post("/detokenize")
async def detokenize(request: DetokenizeRequest, served: Served) -> dict:
    _check_model(served, request.model)
    _check_token_ids(served, request.tokens, "tokens")
    return {"prompt": served.tokenizer.decode(request.tokens)}


trainer = APIRouter(tags=["trainer"])


@trainer.post("/v1/weights", response_model=WeightUpdateResponse)
async def update_weights(request: WeightUpdateRequest, served: Served) -> WeightUpdateResponse:
    path = allowed_path(request.path, served.settings.weights_dir)
    tensors = await asyncio.to_thread(read_state_dict, path)
    try:
        await asyncio.to_thread(served.engine.check_state_dict, tensors)
    except ValueError as exc:
        raise ServiceError(400, "weights_mismatch", f"{request.path}: {exc}") from None
    version = await asyncio.wrap_future(served.engine.update_weights(tensors, request.policy_version))
    return WeightUpdateResponse(policy_version=version, loaded_tensors=len(tensors), path=request.path)


@trainer.post(WEIGHTS_UPLOAD, response_model=WeightUpdateResponse, openapi_extra={"requestBody": {
    "required": True, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
async def upload_weights(request: Request, served: Served, policy_version: int | None = None) -> WeightUpdateResponse:
    """The weights themselves as the body (a safetensors file): a trainer on another node shares no folder."""
    if policy_version is not None and policy_version < 0:
        raise ServiceError(422, "validation_error", "policy_version must be >= 0")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > served.settings.max_weights_bytes:
            raise ServiceError(413, "payload_too_large", f"weights over the limit of "
                               f"{served.settings.max_weights_bytes} bytes (llm_server.max_weights_bytes)")
    tensors = await asyncio.to_thread(read_state_dict_bytes, bytes(body))
    try:
        await asyncio.to_thread(served.engine.check_state_dict, tensors)
    except ValueError as exc:
        raise ServiceError(400, "weights_mismatch", f"uploaded weights: {exc}") from None
    version = await asyncio.wrap_future(served.engine.update_weights(tensors, policy_version))
    return WeightUpdateResponse(policy_version=version, loaded_tensors=len(tensors), path="upload")


@trainer.get("/v1/weights")
async def weights_version(served: Served) -> dict:
    return {"policy_version": served.engine.policy_version}


service = APIRouter(tags=["service"])


@service.get("/v1/stats")
async def stats(served: Served) -> dict:
    engine = served.engine
    s = engine.stats
    return {
        "model": served.name, "policy_version": engine.policy_version, "context_length": served.context_length,
        "max_batch": engine.max_batch, "active_rows": engine.active_rows, "queued_requests": engine.queued,
        "requests": s.requests, "rows": s.rows, "prefill_batches": s.prefill_batches,
        "decode_steps": s.decode_steps, "forward_batches": s.forward_batches, "prompt_tokens": s.prompt_tokens,
        "generated_tokens": s.generated_tokens, "max_rows_in_batch": s.max_rows_in_batch,
        "weight_updates": s.weight_updates, "failed_batches": s.failed_batches,
        "kv_peak_bytes": s.kv_peak_bytes, "kv_reallocations": s.kv_reallocations,
        "prefill_tokens": s.prefill_tokens, "shared_prefix_tokens": s.shared_prefix_tokens,
        "prefill_seconds": round(s.prefill_seconds, 6), "decode_seconds": round(s.decode_seconds, 6),
        "resumed_rows": s.resumed_rows, "reused_prefix_tokens": s.reused_prefix_tokens,
        "structured_outputs": _structured_stats(served),
    }


# ---- request checks and prompts ---------------------------------------------------------------
def _check_model(served: ServedModel, model: str) -> None:
    if model != served.name:
        raise ServiceError(404, "model_not_found",
                           f"model {model!r} is not served here; this server serves {served.name!r}",
                           {"served": [served.name]})


def _check_token_ids(served: ServedModel, ids: list[int], field: str) -> None:
    bad = [t for t in ids if not 0 <= t < served.vocab_size]
    if bad:
        raise ServiceError(400, "invalid_prompt", f"{field} must be in [0, {served.vocab_size}); got {bad[:5]}")


def _check_common(served: ServedModel, request: _SamplingFields) -> None:
    _check_model(served, request.model)
    problems = request.unsupported()
    if problems:
        raise ServiceError(400, "unsupported_parameter", "not supported: " + "; ".join(problems))
    if request.n > served.engine.max_batch:
        raise ServiceError(400, "n_too_large", f"n={request.n} exceeds the server's max batch of "
                                               f"{served.engine.max_batch} rows (--max-batch)")


async def _constraint(served: ServedModel, request: _SamplingFields, chat: bool) -> CompiledGrammar | None:
    grammar = requested_grammar(request, chat=chat)
    return None if grammar is None else await compile_grammar(served.grammars, *grammar)


def _structured_stats(served: ServedModel) -> dict | None:
    if served.grammars is None:
        return None
    s, g = served.engine.stats, served.grammars.stats
    return {**capabilities(), "constrained_rows": s.constrained_rows, "constrained_tokens": s.constrained_tokens,
            "mixed_decode_steps": s.mixed_decode_steps, "mask_seconds": round(s.mask_seconds, 6),
            "mask_us_per_token": round(1e6 * s.mask_seconds / s.constrained_tokens, 1) if s.constrained_tokens
            else None, "aborted_rows": s.grammar_aborts, "grammars_compiled": g.compiles,
            "grammar_cache_hits": g.cache_hits, "grammars_cached": g.cached, "grammar_errors": g.errors,
            "grammar_timeouts": g.timeouts, "compile_seconds": round(g.compile_seconds, 6)}


def _chat_prompt_ids(served: ServedModel, request: ChatCompletionRequest) -> list[int]:
    return _render_chat(served, request.messages, request.tools, request.add_generation_prompt,
                        request.continue_final_message)


def _render_chat(served: ServedModel, raw_messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 add_generation_prompt: bool, continue_final_message: bool) -> list[int]:
    """Token ids of the messages rendered with the served chat template (the exact prompt a chat call uses)."""
    for i, message in enumerate(raw_messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise ServiceError(400, "invalid_message", f"messages[{i}].role must be one of {sorted(ROLES)}, "
                                                       f"got {role!r}")
    messages = [_normalise_message(m) for m in raw_messages]
    try:
        text = served.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message)
    except Exception as exc:  # jinja errors: the messages do not fit the template
        raise ServiceError(400, "invalid_messages", f"the chat template cannot render these messages: {exc}") from None
    return served.tokenizer.encode(text, add_special_tokens=False)


def _normalise_message(message: dict[str, Any]) -> dict[str, Any]:
    """`developer` is OpenAI's newer name for `system`; the templates know only `system`."""
    out = dict(message)
    if out.get("role") == "developer":
        out["role"] = "system"
    if out.get("content") is None:
        out["content"] = ""
    return out


def _completion_prompt_ids(served: ServedModel, request: CompletionRequest) -> list[int]:
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
        _check_token_ids(served, ids, "prompt token ids")
    else:
        ids = []
    if not ids:
        raise ServiceError(400, "invalid_prompt", "the prompt is empty: give prompt (text or token ids) or "
                                                  "prompt_token_ids")
    return ids


async def _generate(served: ServedModel, request: _SamplingFields, prompt_ids: list[int], max_tokens: int | None,
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
def _envelope(kind: str, prefix: str, served: ServedModel, result: GenerationResult, choices: list[dict]) -> dict:
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


def _chat_choice(served: ServedModel, index: int, completion: Completion, logprobs: bool, parse_tools: bool) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": completion.text}
    finish_reason = completion.finish_reason
    if parse_tools:
        content, calls = parse_tool_calls(completion.text)
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


def _completion_choice(served: ServedModel, index: int, completion: Completion, logprobs: bool) -> dict:
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
