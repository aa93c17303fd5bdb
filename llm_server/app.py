"""The OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions, plus
/v1/weights (trainer weight sync), /v1/stats (batching counters, also in /metrics) and the gateway's
episodes (`llm_server.gateway`).
Structured outputs (response_format, structured_outputs, forced tool_choice): `llm_server.structured`."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Header, Request

from common.service import ServiceError, create_app, from_app_state
from llm_server.episodes import EpisodeRegistry
from llm_server.gateway import chat_response, gateway, recorded_chat
from llm_server.metrics import EngineCollector
from llm_server.protocol import (
    EPISODE_HEADER,
    WEIGHTS_UPLOAD,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    WeightUpdateRequest,
    WeightUpdateResponse,
)
from llm_server.serving import (
    ServedModel,
    check_common,
    check_model,
    check_token_ids,
    completion_choice,
    completion_prompt_ids,
    constraint,
    envelope,
    generate,
    render_chat,
    structured_stats,
)
from llm_server.structured import capabilities
from llm_server.weights import allowed_path, read_state_dict, read_state_dict_bytes


def build_app(served: ServedModel) -> FastAPI:
    app = create_app("llm_server", description="OpenAI-compatible transformers model server (CPU), with token ids",
                      max_body_bytes=served.settings.max_body_bytes,
                      body_limits={WEIGHTS_UPLOAD: served.settings.max_weights_bytes})
    app.state.served = served
    app.state.episodes = EpisodeRegistry(served.settings.gateway_drain_timeout_s)
    app.state.metrics_registry.register(EngineCollector(served.engine))
    for router in (openai, gateway, vllm, trainer, service):
        app.include_router(router)
    return app


# ---- routes -------------------------------------------------------------------------------------
Served = Annotated[ServedModel, Depends(from_app_state("served"))]
Episodes = Annotated[EpisodeRegistry, Depends(from_app_state("episodes"))]

openai = APIRouter(tags=["openai"])


@openai.get("/v1/models")
async def models(served: Served) -> dict:
    return {"object": "list", "data": [{
        "id": served.name, "object": "model", "created": served.created, "owned_by": "evolver",
        "max_model_len": served.context_length, "policy_version": served.engine.policy_version,
        "structured_outputs": capabilities() if served.grammars is not None else None}]}


@openai.post("/v1/chat/completions")
async def chat_completions(request: ChatCompletionRequest, served: Served, episodes: Episodes,
                           episode: Annotated[str | None, Header(alias=EPISODE_HEADER)] = None) -> Any:
    if episode is not None:  # the header's alternative to /v1/episodes/{id}/chat/completions
        return await recorded_chat(served, episodes, episode, request)
    return await chat_response(served, request)


@openai.post("/v1/completions")
async def completions(request: CompletionRequest, served: Served) -> dict:
    check_common(served, request)
    if request.echo:
        raise ServiceError(400, "unsupported_parameter", "echo=true is not supported")
    if request.best_of not in (None, request.n):
        raise ServiceError(400, "unsupported_parameter", "best_of is not supported (use n)")
    grammar = await constraint(served, request, chat=False)
    prompt_ids = completion_prompt_ids(served, request)
    top = request.logprobs or 0
    result = await generate(served, request, prompt_ids, request.max_tokens, top, grammar)
    choices = [completion_choice(served, i, c, request.logprobs is not None)
               for i, c in enumerate(result.completions)]
    return envelope("text_completion", "cmpl", served, result, choices)


vllm = APIRouter(tags=["vllm"])


@vllm.post("/tokenize")
async def tokenize(request: TokenizeRequest, served: Served) -> dict:
    check_model(served, request.model)
    if (request.prompt is None) == (request.messages is None):
        raise ServiceError(400, "invalid_request", "give exactly one of prompt or messages")
    if request.messages is not None:
        tokens = render_chat(served, request.messages, request.tools, request.add_generation_prompt,
                              request.continue_final_message)
    else:
        tokens = served.tokenizer.encode(request.prompt, add_special_tokens=False)
    return {"tokens": tokens, "count": len(tokens), "max_model_len": served.context_length}


@vllm.post("/detokenize")
async def detokenize(request: DetokenizeRequest, served: Served) -> dict:
    check_model(served, request.model)
    check_token_ids(served, request.tokens, "tokens")
    return {"prompt": served.tokenizer.decode(request.tokens)}


trainer = APIRouter(tags=["trainer"])


@trainer.post("/v1/weights", response_model=WeightUpdateResponse)
async def update_weights(request: WeightUpdateRequest, served: Served, episodes: Episodes) -> WeightUpdateResponse:
    path = allowed_path(request.path, served.settings.weights_dir)
    tensors = await asyncio.to_thread(read_state_dict, path)
    return await _load_weights(served, episodes, tensors, request.policy_version, request.path)


@trainer.post(WEIGHTS_UPLOAD, response_model=WeightUpdateResponse, openapi_extra={"requestBody": {
    "required": True, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
async def upload_weights(request: Request, served: Served, episodes: Episodes,
                         policy_version: int | None = None) -> WeightUpdateResponse:
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
    return await _load_weights(served, episodes, tensors, policy_version, "upload")


async def _load_weights(served: ServedModel, episodes: EpisodeRegistry, tensors: dict, policy_version: int | None,
                        source: str) -> WeightUpdateResponse:
    """Check `tensors` against the model, then load them once no open episode still samples (an episode samples
    from one policy version: llm_server.episodes); `source` names them in errors and the answer."""
    try:
        await asyncio.to_thread(served.engine.check_state_dict, tensors)
    except ValueError as exc:
        raise ServiceError(400, "weights_mismatch", f"{'uploaded weights' if source == 'upload' else source}: "
                           f"{exc}") from None
    async with episodes.weight_swap():
        version = await asyncio.wrap_future(served.engine.update_weights(tensors, policy_version))
    if source == "upload":
        served.weight_uploads += 1
    return WeightUpdateResponse(policy_version=version, loaded_tensors=len(tensors), path=source)


@trainer.get("/v1/weights")
async def weights_version(served: Served) -> dict:
    return {"policy_version": served.engine.policy_version}


service = APIRouter(tags=["service"])


@service.get("/v1/stats")
async def stats(served: Served, episodes: Episodes) -> dict:
    engine = served.engine
    s = engine.stats
    return {
        "model": served.name, "policy_version": engine.policy_version, "context_length": served.context_length,
        "max_batch": engine.max_batch, "active_rows": engine.active_rows, "queued_requests": engine.queued,
        "requests": s.requests, "rows": s.rows, "prefill_batches": s.prefill_batches,
        "decode_steps": s.decode_steps, "forward_batches": s.forward_batches, "prompt_tokens": s.prompt_tokens,
        "generated_tokens": s.generated_tokens, "max_rows_in_batch": s.max_rows_in_batch,
        "weight_updates": s.weight_updates, "weight_uploads": served.weight_uploads,
        "failed_batches": s.failed_batches,
        "kv_peak_bytes": s.kv_peak_bytes, "kv_reallocations": s.kv_reallocations,
        "prefill_tokens": s.prefill_tokens, "shared_prefix_tokens": s.shared_prefix_tokens,
        "prefill_seconds": round(s.prefill_seconds, 6), "decode_seconds": round(s.decode_seconds, 6),
        "resumed_rows": s.resumed_rows, "reused_prefix_tokens": s.reused_prefix_tokens,
        "prefix_cache_bytes": engine.prefix_cache_held_bytes, "prefix_cache_limit_bytes": engine.prefix_cache_bytes,
        "structured_outputs": structured_stats(served), "gateway": episodes.stats(),
    }


