"""The gateway on `llm_server --model tiny` over HTTP: episodes by URL and by header, calls recorded token for
token, continued calls spliced onto their own sampled ids, streaming through the `openai` SDK, experience
shown but never in a training context, the errors, and the weight-update rule."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import openai
import pytest

from common.service import ServiceError
from engine.models import load_model, load_tokenizer
from llm_server.episodes import EpisodeRegistry
from llm_server.protocol import EpisodeOpen, EpisodeRecord
from tests.helpers import ServiceProcess

TOOLS = [{"type": "function", "function": {"name": "move", "parameters": {
    "type": "object", "properties": {"to": {"enum": ["left", "right"]}}, "required": ["to"],
    "additionalProperties": False}}}]
START = [{"role": "system", "content": "You move."}, {"role": "user", "content": "go left"}]


def _open(server: ServiceProcess, **body: object) -> str:
    response = httpx.post(f"{server.url}/v1/episodes", json=body, timeout=30)
    assert response.status_code == 201, response.text
    return response.json()["episode_id"]


def _end(server: ServiceProcess, episode: str) -> EpisodeRecord:
    response = httpx.post(f"{server.url}/v1/episodes/{episode}/end", timeout=30)
    assert response.status_code == 200, response.text
    return EpisodeRecord.model_validate(response.json())


def _client(server: ServiceProcess, episode: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1/episodes/{episode}", api_key="unused", max_retries=0)


def _rendered(tokenizer: object, messages: list, tools: list | None = None) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def _tool_turn(client: openai.OpenAI, messages: list, **options: object) -> dict:
    """One call forced to a tool call, then its reply and a tool result appended as an agent loop does."""
    reply = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, tool_choice="required",
                                           max_tokens=60, temperature=1.0, **options).choices[0].message
    assert reply.tool_calls, reply
    messages.append(reply.model_dump(exclude_none=True))  # what the SDK's users send back
    for call in reply.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": f"moved {call.function.arguments}"})
    return messages[-2 - len(reply.tool_calls) + 1]


def test_calls_continue_their_own_sampled_ids_and_a_rewrite_does_not(tiny_server: ServiceProcess) -> None:
    episode = _open(tiny_server, metadata={"task_id": "t1"})
    client = _client(tiny_server, episode)
    messages = [dict(m) for m in START]
    _tool_turn(client, messages)
    _tool_turn(client, messages)
    # The agent rewrites its history: it keeps only the task and the last result.
    rewritten = [*START, {"role": "user", "content": messages[-1]["content"]}]
    client.chat.completions.create(model="tiny", messages=rewritten, max_tokens=5)
    record = _end(tiny_server, episode)
    assert record.status == "ended" and record.metadata == {"task_id": "t1"}
    first, second, third = record.calls
    assert [c.extends for c in record.calls] == [None, 0, None]
    assert first.tool_calls[0]["id"].startswith("call_") and first.tools == TOOLS
    for call in record.calls:
        assert len(call.token_ids) == len(call.logprobs) > 0 and call.policy_version == first.policy_version
        assert call.train_prompt_ids == call.prompt_ids  # no experience in this episode
    # Token exactness: the second call's context is the first call's prompt and sampled ids, then the glue.
    assert second.prompt_ids == first.prompt_ids + first.token_ids + second.glue_ids
    model_tokenizer = load_model("tiny")[1]
    glue = model_tokenizer.decode(second.glue_ids)
    assert "<|im_start|>tool" in glue and glue.endswith("<|im_start|>assistant\n")
    assert third.glue_ids == [] and third.prompt_ids == _rendered(model_tokenizer, rewritten)
    stats = httpx.get(f"{tiny_server.url}/v1/stats", timeout=30).json()["gateway"]
    assert stats["continued_calls"] >= 1


def test_streaming_tool_calls_through_the_sdk_and_the_header(tiny_server: ServiceProcess) -> None:
    episode = _open(tiny_server)
    client = openai.OpenAI(base_url=f"{tiny_server.url}/v1", api_key="unused", max_retries=0,
                           default_headers={"X-Evolver-Episode": episode})
    stream = client.chat.completions.create(model="tiny", messages=START, tools=TOOLS, tool_choice="required",
                                            max_tokens=60, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    calls = [c for chunk in chunks for choice in chunk.choices for c in choice.delta.tool_calls or []]
    finish = [choice.finish_reason for chunk in chunks for choice in chunk.choices if choice.finish_reason]
    usage = [chunk.usage for chunk in chunks if chunk.usage]
    record = _end(tiny_server, episode)
    (call,) = record.calls
    assert finish == ["tool_calls"] and len(usage) == 1
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in call.tool_calls]
    assert usage[0].completion_tokens == len(call.token_ids) and usage[0].prompt_tokens == len(call.prompt_ids)
    # Without an episode the plain route streams too.
    plain = openai.OpenAI(base_url=f"{tiny_server.url}/v1", api_key="unused", max_retries=0)
    text = "".join(c.choices[0].delta.content or "" for c in plain.chat.completions.create(
        model="tiny", messages=START, max_tokens=6, temperature=0, stream=True) if c.choices)
    assert text == plain.chat.completions.create(model="tiny", messages=START, max_tokens=6,
                                                 temperature=0).choices[0].message.content


def test_experience_is_shown_and_never_in_a_training_context(tiny_server: ServiceProcess) -> None:
    tokenizer = load_tokenizer("tiny")
    episode = _open(tiny_server, experience="Always move left first.")
    client = _client(tiny_server, episode)
    messages = [dict(m) for m in START]
    _tool_turn(client, messages)
    client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=5)
    record = _end(tiny_server, episode)
    assert record.with_experience and [c.extends for c in record.calls] == [None, 0]
    for call in record.calls:
        shown, trained = tokenizer.decode(call.prompt_ids), tokenizer.decode(call.train_prompt_ids)
        assert "<EXP>\nAlways move left first.\n</EXP>" in shown and "Always move" not in trained
    first, second = record.calls
    assert first.train_prompt_ids == _rendered(tokenizer, START, TOOLS)
    assert second.train_prompt_ids == first.train_prompt_ids + first.token_ids + second.glue_ids


def test_unknown_ended_and_malformed(tiny_server: ServiceProcess) -> None:
    url = tiny_server.url
    body = {"model": "tiny", "messages": START, "max_tokens": 3}
    unknown = httpx.post(f"{url}/v1/episodes/nope/chat/completions", json=body, timeout=30)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "episode_not_found"
    by_header = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"X-Evolver-Episode": "nope"}, timeout=30)
    assert by_header.status_code == 404
    episode = _open(tiny_server)
    malformed = httpx.post(f"{url}/v1/episodes/{episode}/chat/completions",
                           json={"model": "tiny", "messages": "hello"}, timeout=30)
    assert malformed.status_code == 422 and "messages" in malformed.json()["error"]["message"]
    several = httpx.post(f"{url}/v1/episodes/{episode}/chat/completions", json={**body, "n": 2}, timeout=30)
    assert several.status_code == 400 and several.json()["error"]["message"].startswith("n:")
    assert httpx.post(f"{url}/v1/episodes/{episode}/chat/completions", json=body, timeout=30).status_code == 200
    assert len(_end(tiny_server, episode).calls) == 1
    late = httpx.post(f"{url}/v1/episodes/{episode}/chat/completions", json=body, timeout=30)
    assert late.status_code == 409 and late.json()["error"]["code"] == "episode_ended"
    again = httpx.post(f"{url}/v1/episodes", json={"episode_id": episode}, timeout=30)
    assert again.status_code == 409
    bad_id = httpx.post(f"{url}/v1/episodes", json={"episode_id": "a b"}, timeout=30)
    assert bad_id.status_code == 422 and "episode_id" in bad_id.json()["error"]["message"]


async def test_a_weight_update_waits_for_open_episodes(tiny_server: ServiceProcess, tmp_path: Path) -> None:
    """The rule: an episode samples from one policy version. The update waits until the open episode ends; an
    episode opened meanwhile starts on the new weights."""
    from safetensors.torch import save_file

    model, _ = load_model("tiny")
    weights = tmp_path / "same.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}, str(weights))
    body = {"model": "tiny", "messages": START, "max_tokens": 3}
    async with httpx.AsyncClient(base_url=tiny_server.url, timeout=60) as http:
        start = (await http.get("/v1/weights")).json()["policy_version"]
        old = (await http.post("/v1/episodes", json={})).json()["episode_id"]
        assert (await http.post(f"/v1/episodes/{old}/chat/completions", json=body)).status_code == 200
        update = asyncio.create_task(http.post("/v1/weights", json={"path": str(weights)}))
        while not (await http.get("/v1/stats")).json()["gateway"]["weight_update_waiting"]:
            await asyncio.sleep(0)  # until the update waits at the server
        newer = asyncio.create_task(http.post("/v1/episodes", json={}))
        await http.get("/v1/stats")  # a round trip: the open request has reached the server
        assert not update.done() and not newer.done()
        late = await http.post(f"/v1/episodes/{old}/chat/completions", json=body)
        assert late.json()["policy_version"] == start
        await http.post(f"/v1/episodes/{old}/end")
        assert (await update).json()["policy_version"] == start + 1
        new_id = (await newer).json()["episode_id"]
        answer = await http.post(f"/v1/episodes/{new_id}/chat/completions", json=body)
        assert answer.json()["policy_version"] == start + 1
        record = EpisodeRecord.model_validate((await http.post(f"/v1/episodes/{old}/end")).json())
        assert {c.policy_version for c in record.calls} == {start}
        await http.post(f"/v1/episodes/{new_id}/end")


async def test_old_records_are_dropped_and_their_ids_still_refuse_calls() -> None:
    registry = EpisodeRegistry(drain_timeout_s=1, keep_records=1)
    first = await registry.open_episode(EpisodeOpen())
    second = await registry.open_episode(EpisodeOpen(episode_id="mine"))
    await registry.end(first.episode_id)
    await registry.end("mine")
    assert registry.find("mine") is second
    with pytest.raises(ServiceError) as dropped:
        registry.find(first.episode_id)
    assert dropped.value.status == 410
    with pytest.raises(ServiceError) as late:
        registry.for_call(first.episode_id)
    assert late.value.status == 409
    with pytest.raises(ServiceError) as again:
        await registry.open_episode(EpisodeOpen(episode_id=first.episode_id))
    assert again.value.status == 409


async def test_a_weight_update_cuts_an_episode_still_open_after_the_drain_timeout() -> None:
    registry = EpisodeRegistry(drain_timeout_s=0.05)
    stuck = await registry.open_episode(EpisodeOpen())
    async with registry.weight_swap():
        assert stuck.ended_reason == "weight_update" and not registry.open
    with pytest.raises(ServiceError) as late:
        registry.for_call(stuck.episode_id)
    assert late.value.status == 409 and registry.stats()["cut_by_weight_update"] == 1


def test_a_forced_episode_calls_a_tool_every_time_and_records_what_came_back(tiny_server: ServiceProcess) -> None:
    """`force_tools`: the agent asks with tool_choice auto (its own code, unchanged), the gateway answers every call
    with a valid call of an offered tool, and the record pairs each call with the result the agent sent back."""
    episode = _open(tiny_server, force_tools=True)
    client = _client(tiny_server, episode)
    messages = list(START)
    for turn in range(3):
        reply = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=60,
                                               temperature=1.0).choices[0].message
        assert reply.tool_calls and reply.tool_calls[0].function.name == "move", reply
        messages.append(reply.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": c.id, "content": f"result {turn}.{i}"}
                     for i, c in enumerate(reply.tool_calls)]
    record = _end(tiny_server, episode)
    assert record.mode == "forced" and len(record.calls) == 3
    issued = [c for call in record.calls[:2] for c in call.tool_calls]  # the last call's results never came back
    assert [(o.tool_call_id, o.name, o.result) for o in record.observed] == [
        (c["id"], "move", f"result {turn}.{i}") for turn, call in enumerate(record.calls[:2])
        for i, c in enumerate(call.tool_calls)]
    assert all(o.arguments["to"] in ("left", "right") for o in record.observed) and len(issued) == len(record.observed)
    # Grounded: a listed argument takes one of its values (the tools shown in the prompt stay as the agent sent them).
    grounded = _open(tiny_server, force_tools=True, tool_arguments={"move": {"to": ["right"]}})
    client = _client(tiny_server, grounded)
    for _ in range(3):
        reply = client.chat.completions.create(model="tiny", messages=START, tools=TOOLS, max_tokens=60,
                                               temperature=1.0).choices[0].message
        assert [(c.function.name, c.function.arguments) for c in reply.tool_calls] == [("move", '{"to": "right"}')]
    assert _end(tiny_server, grounded).calls[0].tools == TOOLS
    alone = httpx.post(f"{tiny_server.url}/v1/episodes", json={"tool_arguments": {"move": {"to": ["left"]}}},
                       timeout=30)
    assert alone.status_code == 422 and "set force_tools too" in alone.text


def test_a_scripted_episode_gives_its_replies_as_the_model_would_write_them(tiny_server: ServiceProcess) -> None:
    tokenizer = load_tokenizer("tiny")
    script = ['<tool_call>{"name": "move", "arguments": {"to": "left"}}</tool_call>', "The answer is left."]
    episode = _open(tiny_server, script=script)
    client = _client(tiny_server, episode)
    messages = list(START)
    reply = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS).choices[0].message
    assert [(c.function.name, c.function.arguments) for c in reply.tool_calls] == [("move", '{"to": "left"}')]
    messages += [reply.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": reply.tool_calls[0].id,
                                                       "content": "you are left"}]
    assert client.chat.completions.create(model="tiny", messages=messages,
                                          tools=TOOLS).choices[0].message.content == "The answer is left."
    with pytest.raises(openai.ConflictError, match="script"):
        client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS)
    record = _end(tiny_server, episode)
    assert record.mode == "scripted" and record.calls[1].extends == 0  # merged, as a sampled episode's would be
    for call, text in zip(record.calls, script, strict=True):
        assert call.token_ids == tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    assert [(o.name, o.arguments, o.result) for o in record.observed] == [("move", {"to": "left"}, "you are left")]
    stats = httpx.get(f"{tiny_server.url}/v1/stats", timeout=30).json()["gateway"]
    assert stats["scripted_calls"] >= 2 and stats["forced_calls"] >= 3
    both = httpx.post(f"{tiny_server.url}/v1/episodes", json={"force_tools": True, "script": ["x"]}, timeout=30)
    assert both.status_code == 422 and "force_tools or script" in both.text

    # A script recorded in another run: an id that run's tool generated is this run's own in the later replies.
    carried = _open(tiny_server, script=[script[0], "Cancel order ORD7AB1 at left."],
                    script_results=['{"order": "ORD7AB1", "at": "left"}'])
    client = _client(tiny_server, carried)
    reply = client.chat.completions.create(model="tiny", messages=START, tools=TOOLS).choices[0].message
    messages = [*START, reply.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": '{"order": "ORD9CD2", "at": "left"}'}]
    assert client.chat.completions.create(model="tiny", messages=messages,
                                          tools=TOOLS).choices[0].message.content == "Cancel order ORD9CD2 at left."
    _end(tiny_server, carried)
    alone = httpx.post(f"{tiny_server.url}/v1/episodes", json={"script_results": ["x"]}, timeout=30)
    assert alone.status_code == 422 and "give the script too" in alone.text
