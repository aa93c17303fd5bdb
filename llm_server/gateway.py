"""The gateway: an agent's OpenAI chat calls, attributed to an episode and recorded token for token.

- `POST /v1/episodes` `{"episode_id"?, "experience"?, "metadata"?, "force_tools"?, "script"?, "script_results"?,
  "sampling"?}`: open one (201, its record). `sampling` `{"temperature"?, "seed"?}`: every call samples with it,
  whatever the agent sends (a held-out evaluation at a fixed temperature). `force_tools`: every call offering tools is constrained to a call of one of them
  (exploration); `script`: the replies are given, not sampled (a reference played through the agent), their
  generated ids carried over to this run's by `script_results`. Both are off-policy.
- `POST /v1/episodes/{id}/chat/completions`: OpenAI chat, streaming or not, tools included; an unchanged
  SDK client needs only `base_url=<server>/v1/episodes/{id}` (any `model` name: the policy answers). `POST /v1/chat/completions` with the
  `X-Evolver-Episode: {id}` header is the same call.
- `POST /v1/episodes/{id}/end`: end it (idempotent) and get its record; `GET /v1/episodes/{id}`: the record.
- Unknown episode: 404; a call after the episode ended, or past a script's last reply: 409; a malformed body:
  422 naming the field.

How calls continue each other and the weight-update rule: `llm_server.episodes`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse

from common.service import ServiceError, from_app_state
from engine.generation import Completion, GenerationResult
from llm_server.episodes import Episode, EpisodeRegistry, with_experience
from llm_server.protocol import ChatCompletionRequest, EpisodeOpen, EpisodeRecord, GatewayCall
from llm_server.serving import (
    ServedModel,
    chat_choice,
    chat_prompt_ids,
    check_common,
    constraint,
    envelope,
    generate,
    render_chat,
    render_text,
)

Served = Annotated[ServedModel, Depends(from_app_state("served"))]
Episodes = Annotated[EpisodeRegistry, Depends(from_app_state("episodes"))]

gateway = APIRouter(tags=["gateway"])


@gateway.post("/v1/episodes", status_code=201, response_model=EpisodeRecord)
async def open_episode(request: EpisodeOpen, episodes: Episodes) -> EpisodeRecord:
    return (await episodes.open_episode(request)).record()


@gateway.get("/v1/episodes/{episode_id}", response_model=EpisodeRecord)
async def episode_record(episode_id: str, episodes: Episodes) -> EpisodeRecord:
    return episodes.find(episode_id).record()


@gateway.post("/v1/episodes/{episode_id}/end", response_model=EpisodeRecord)
async def end_episode(episode_id: str, episodes: Episodes) -> EpisodeRecord:
    return (await episodes.end(episode_id)).record()


@gateway.get("/v1/episodes/{episode_id}/models")
async def episode_models(episode_id: str, served: Served, episodes: Episodes) -> dict:
    episodes.find(episode_id)
    return {"object": "list", "data": [{"id": served.name, "object": "model", "created": served.created,
                                        "owned_by": "evolver"}]}


@gateway.post("/v1/episodes/{episode_id}/chat/completions")
async def episode_chat(episode_id: str, request: ChatCompletionRequest, served: Served,
                       episodes: Episodes) -> Any:
    return await recorded_chat(served, episodes, episode_id, request)


async def chat_response(served: ServedModel, request: ChatCompletionRequest) -> Any:
    """A plain chat call (no episode), as JSON or, with `stream`, as server-sent events."""
    check_common(served, request)
    grammar = await constraint(served, request, chat=True)
    prompt_ids = chat_prompt_ids(served, request)
    result = await generate(served, request, prompt_ids, request.max_completion_tokens or request.max_tokens,
                            _top(request), grammar)
    choices = [chat_choice(served, i, c, request.logprobs, _parse_tools(request))
               for i, c in enumerate(result.completions)]
    return _respond(request, envelope("chat.completion", "chatcmpl", served, result, choices))


async def recorded_chat(served: ServedModel, episodes: EpisodeRegistry, episode_id: str,
                        request: ChatCompletionRequest) -> Any:
    """A chat call of an episode: sampled from the episode's context and recorded."""
    episode = episodes.for_call(episode_id)
    # An episode's model is the policy, whatever name the agent was written for (an unchanged agent that asks
    # for "gpt-4o-mini" needs only its base URL changed).
    request = request.model_copy(update={"model": served.name})
    check_common(served, request)
    if request.n != 1:
        raise ServiceError(400, "invalid_request", f"n: an episode records one completion per call; got n={request.n}, "
                                                   "send n=1 (or separate calls)")
    if request.continue_final_message or not request.add_generation_prompt:
        raise ServiceError(400, "invalid_request", "continue_final_message / add_generation_prompt: an episode call "
                                                   "always starts a new assistant turn")
    if episode.sampling is not None:  # the episode's own sampling wins over what the agent asks for
        forced = {"temperature": episode.sampling.temperature} if episode.sampling.temperature is not None else {}
        if episode.sampling.seed is not None:
            forced["seed"] = episode.sampling.seed + episode.next_index
        request = request.model_copy(update=forced)
    if episode.mode == "forced" and request.tools and request.tool_choice in (None, "auto"):
        request = request.model_copy(update={"tool_choice": "required"})
    if episode.mode == "scripted" and episode.next_index >= len(episode.script):
        raise ServiceError(409, "script_ended", f"episode {episode_id!r} scripts {len(episode.script)} replies and "
                                                "this is one call more: the agent called more often than the "
                                                "script has turns")
    grammar = None
    if episode.mode != "scripted":
        # A forced call's listed arguments take one of their values (the grammar only: the prompt shows the tools
        # as the agent sent them).
        constrained = (request.model_copy(update={"tools": grounded(request.tools, episode.tool_arguments)})
                       if episode.mode == "forced" and episode.tool_arguments and request.tools else request)
        grammar = await constraint(served, constrained, chat=True)
    index = episode.start_call()
    generation_ids, train_ids, extends, glue = _contexts(served, episode, request)
    if episode.mode == "scripted":
        result = _scripted(served, episode.scripted_reply(index, request.messages), generation_ids)
    else:
        result = await generate(served, request, generation_ids,
                                request.max_completion_tokens or request.max_tokens, _top(request), grammar)
    completion = result.completions[0]
    choice = chat_choice(served, 0, completion, request.logprobs, _parse_tools(request), episode.call_ids(index))
    message = choice["message"]
    episodes.record_call(episode, GatewayCall(
        index=index, prompt_ids=generation_ids, train_prompt_ids=train_ids, token_ids=list(completion.token_ids),
        logprobs=list(completion.token_logprobs), policy_version=result.policy_version,
        finish_reason=choice["finish_reason"], content=message.get("content"),
        tool_calls=message.get("tool_calls") or [], tools=request.tools, messages=request.messages,
        extends=extends, glue_ids=glue))
    body = envelope("chat.completion", "chatcmpl", served, result, [choice])
    body["episode_id"] = episode.episode_id
    return _respond(request, body)


def _contexts(served: ServedModel, episode: Episode, request: ChatCompletionRequest
              ) -> tuple[list[int], list[int], int | None, list[int]]:
    """(ids to generate from, the same without experience, the call continued, the ids after its sampled ones)."""
    found = episode.continued(request.messages, request.tools)
    if found is not None:
        call, at = found
        glue = _glue(served, call, request.messages, at, request.tools)
        if glue is not None:
            return (call.prompt_ids + call.token_ids + glue, call.train_prompt_ids + call.token_ids + glue,
                    call.index, glue)
    train_ids = chat_prompt_ids(served, request)
    if episode.experience is None:
        return train_ids, train_ids, None, []
    shown = render_chat(served, with_experience(request.messages, episode.experience), request.tools, True, False)
    return shown, train_ids, None, []


def _glue(served: ServedModel, call: GatewayCall, messages: list[dict[str, Any]], at: int,
          tools: list[dict[str, Any]] | None) -> list[int] | None:
    """The ids that follow `call`'s sampled ids in this call's context: the template's closing of that
    assistant turn, the messages after it, the next assistant header. None when the template does not
    render the history as a prefix of itself (then the call is rendered as sent)."""
    before = render_text(served, messages[:at], tools, True)
    turn = render_text(served, messages[:at + 1], tools, False)
    full = render_text(served, messages, tools, True)
    eos = served.tokenizer.eos_token or ""
    if not (eos and turn.startswith(before) and full.startswith(turn)):
        return None
    body = turn[len(before):]
    end = body.rfind(eos)
    if end < 0:
        return None
    ended_with_eos = bool(call.token_ids) and call.token_ids[-1] in served.engine.eos_ids
    closing = body[end + len(eos):] if ended_with_eos else body[end:]
    return served.tokenizer.encode(closing + full[len(turn):], add_special_tokens=False)


def grounded(tools: list[dict[str, Any]], values: dict[str, dict[str, list[Any]]]) -> list[dict[str, Any]]:
    """The tools a forced call may use, each argument an `enum` of its listed values: arguments without values
    are left out, a tool whose required argument has none is left out (its call could only be refused), and a call
    names at least one argument. The tools as given when that leaves none."""
    out = []
    for tool in tools:
        function = tool.get("function") or {}
        parameters = function.get("parameters") or {}
        properties = parameters.get("properties") or {}
        known = {arg: list(v) for arg, v in values.get(function.get("name", ""), {}).items() if v and arg in properties}
        required = list(parameters.get("required") or [])
        if not properties:
            out.append(tool)
            continue
        if not known or any(arg not in known for arg in required):
            continue
        schema = {"type": "object", "properties": {arg: {"enum": v} for arg, v in known.items()},
                  "required": required, "additionalProperties": False}
        if not required:
            schema["minProperties"] = 1
        out.append({**tool, "function": {**function, "parameters": schema}})
    return out or tools


def _scripted(served: ServedModel, reply: str, prompt_ids: list[int]) -> GenerationResult:
    """A scripted reply as if sampled: its ids as the tokenizer writes it, then the end of the turn (log-probs 0:
    nothing was sampled)."""
    ids = served.tokenizer.encode(reply, add_special_tokens=False) + [served.tokenizer.eos_token_id]
    completion = Completion(token_ids=ids, token_logprobs=[0.0] * len(ids), top_logprobs=None, text=reply,
                            finish_reason="stop")
    return GenerationResult(prompt_ids, [completion], served.engine.policy_version)


def _top(request: ChatCompletionRequest) -> int:
    return (request.top_logprobs or 0) if request.logprobs else 0


def _parse_tools(request: ChatCompletionRequest) -> bool:
    return bool(request.tools) and request.tool_choice != "none"


# ---- streaming ----------------------------------------------------------------------------------
def _respond(request: ChatCompletionRequest, body: dict[str, Any]) -> Any:
    if not request.stream:
        return body
    usage = bool((request.stream_options or {}).get("include_usage"))
    return StreamingResponse(_events(body, usage), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


def _events(body: dict[str, Any], include_usage: bool) -> Iterator[str]:
    """The completion as OpenAI `chat.completion.chunk` events: the role, the content, each tool call, the finish
    (with the evolver extensions: token ids and log-probs), the usage when asked, then `[DONE]`. The events are
    sent once the completion is sampled: the engine does not hand out partial rows."""
    head = {"id": body["id"], "object": "chat.completion.chunk", "created": body.get("created", int(time.time())),
            "model": body["model"]}

    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        return f"data: {json.dumps({**head, 'choices': choices, **extra})}\n\n"

    for choice in body["choices"]:
        i, message = choice["index"], choice["message"]
        yield event([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        if message.get("content"):
            yield event([{"index": i, "delta": {"content": message["content"]}, "finish_reason": None}])
        for position, call in enumerate(message.get("tool_calls") or []):
            yield event([{"index": i, "delta": {"tool_calls": [{"index": position, **call}]}, "finish_reason": None}])
        yield event([{"index": i, "delta": {}, "finish_reason": choice["finish_reason"], "logprobs": choice["logprobs"],
                      "token_ids": choice["token_ids"], "token_logprobs": choice["token_logprobs"]}],
                    prompt_token_ids=body["prompt_token_ids"], policy_version=body["policy_version"],
                    **({"episode_id": body["episode_id"]} if "episode_id" in body else {}))
    if include_usage:
        yield event([], usage=body["usage"])
    yield "data: [DONE]\n\n"
