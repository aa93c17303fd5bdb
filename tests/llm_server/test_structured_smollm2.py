"""Structured outputs from `llm_server --model smollm2` over real HTTP, through the official openai client
(issue 13's acceptance): json_schema on 20 varied prompts, choice, regex, forced tool calls, a 400 for a
malformed schema, and constrained and free requests sharing decode steps."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import jsonschema
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from tests.helpers import ServiceProcess

pytestmark = pytest.mark.slow

# Free-text fields carry maxLength, numbers a range: greedy SmolLM2 otherwise sometimes repeats a phrase
# inside an open string until max_tokens (measured: 3 of these 20 prompts without the bounds), and a
# grammar cannot end a string the model will not end. Bounds are what a client of a small model should send.
NAME = {"type": "string", "minLength": 1, "maxLength": 40}
SCHEMAS = {
    "person": {"type": "object", "additionalProperties": False, "required": ["name", "age", "occupation"],
               "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 130},
                              "occupation": NAME}},
    "city": {"type": "object", "additionalProperties": False, "required": ["city", "country", "population"],
             "properties": {"city": NAME, "country": NAME,
                            "population": {"type": "integer", "minimum": 0, "maximum": 100_000_000}}},
    "recipe": {"type": "object", "additionalProperties": False, "required": ["title", "ingredients", "minutes"],
               "properties": {"title": NAME, "minutes": {"type": "integer", "minimum": 1, "maximum": 600},
                              "ingredients": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 5}}},
    "verdict": {"type": "object", "additionalProperties": False, "required": ["answer", "confidence"],
                "properties": {"answer": {"enum": ["yes", "no"]},
                               "confidence": {"type": "number", "minimum": 0, "maximum": 1}}},
    "step": {"type": "object", "additionalProperties": False, "required": ["step", "label", "reason"],
             "properties": {"step": {"type": "integer", "minimum": 0, "maximum": 50}, "label": {"enum": ["GOOD", "BAD"]},
                            "reason": {"type": "string", "maxLength": 120}}},
}
PROMPTS = [
    ("person", "Describe a famous scientist."), ("person", "Invent a character for a novel."),
    ("person", "Who is a typical nurse?"), ("person", "Tell me about a chef."),
    ("city", "Tell me about Paris."), ("city", "Which city is the capital of Japan?"),
    ("city", "Describe a city in Brazil."), ("city", "What is the biggest city in Africa?"),
    ("recipe", "How do I make pancakes?"), ("recipe", "Give me a salad recipe."),
    ("recipe", "How to cook rice?"), ("recipe", "A quick pasta dish."),
    ("verdict", "Is water wet?"), ("verdict", "Is 7 a prime number?"),
    ("verdict", "Can fish fly?"), ("verdict", "Is the earth round?"),
    ("step", "The agent searched for a flight from Paris to Rome. Label this step."),
    ("step", "The agent booked a ticket without checking the passenger. Label this step."),
    ("step", "The agent called cancel_order on an order that does not exist. Label step 3."),
    ("step", "Step 2: the agent listed the orders to find the right one. Label it."),
]


def _client(server: ServiceProcess) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=300, max_retries=0)


def _stats(server: ServiceProcess) -> dict:
    return httpx.get(f"{server.url}/v1/stats", timeout=10).json()


async def test_json_schema_is_valid_on_twenty_prompts(smollm2_server: ServiceProcess) -> None:
    client = AsyncOpenAI(base_url=f"{smollm2_server.url}/v1", api_key="unused", timeout=600, max_retries=0)

    async def ask(name: str, question: str) -> tuple[str, object]:
        response = await client.chat.completions.create(
            model="smollm2", temperature=0, max_tokens=120,
            messages=[{"role": "user", "content": f"{question} Answer in JSON."}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}})
        return name, response.choices[0]

    answers = await asyncio.gather(*[ask(name, question) for name, question in PROMPTS])
    await client.close()
    for name, choice in answers:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), SCHEMAS[name])
    assert _stats(smollm2_server)["structured_outputs"]["constrained_rows"] >= len(PROMPTS)


def test_choice_regex_and_capabilities(smollm2_server: ServiceProcess) -> None:
    client = _client(smollm2_server)
    listed = client.models.list().data[0].model_extra["structured_outputs"]
    assert listed["engine"] == "llguidance" and "json_schema" in listed["formats"]
    for question in ["Is the sky green?", "Is Paris in France?"]:
        response = client.chat.completions.create(
            model="smollm2", temperature=0, max_tokens=10, messages=[{"role": "user", "content": question}],
            extra_body={"structured_outputs": {"choice": ["yes", "no", "unsure"]}})
        assert response.choices[0].message.content in {"yes", "no", "unsure"}
        assert response.choices[0].finish_reason == "stop"
    # Token in, token out on /v1/completions, with a regex.
    prompt_ids = httpx.post(f"{smollm2_server.url}/tokenize", timeout=60, json={
        "model": "smollm2", "messages": [{"role": "user", "content": "When did the war end? Give a date."}]}).json()
    completion = client.completions.create(
        model="smollm2", prompt=prompt_ids["tokens"], temperature=0, max_tokens=20,
        extra_body={"structured_outputs": {"regex": r"[0-9]{4}-[0-9]{2}-[0-9]{2}"}})
    choice = completion.choices[0]
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", choice.text) and choice.finish_reason == "stop"
    assert completion.model_extra["prompt_token_ids"] == prompt_ids["tokens"]
    assert len(choice.model_extra["token_ids"]) == len(choice.model_extra["token_logprobs"])


def test_named_tool_choice_yields_a_tool_call(smollm2_server: ServiceProcess) -> None:
    tools = [{"type": "function", "function": {
        "name": "search_flight", "description": "find flights",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["origin", "destination"],
                       "properties": {"origin": NAME, "destination": NAME}}}},
        {"type": "function", "function": {"name": "cancel_order", "parameters": {
            "type": "object", "properties": {"order_id": {"type": "integer"}}, "required": ["order_id"]}}}]
    response = _client(smollm2_server).chat.completions.create(
        model="smollm2", temperature=0, max_tokens=60, tools=tools,
        tool_choice={"type": "function", "function": {"name": "search_flight"}},
        messages=[{"role": "user", "content": "Find me a flight from Paris to Rome."}])
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0].function
    assert call.name == "search_flight"
    assert set(json.loads(call.arguments)) == {"origin", "destination"}


def test_malformed_schema_is_a_400_naming_the_problem(smollm2_server: ServiceProcess) -> None:
    client = _client(smollm2_server)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="smollm2", max_tokens=10, messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {
                "name": "broken", "schema": {"type": "object", "properties": {"age": {"type": "integr"}}}}})
    assert info.value.status_code == 400
    message = str(info.value)
    assert "response_format" in message and "Invalid type: integr" in message, message


async def test_constrained_and_free_requests_share_decode_steps(smollm2_server: ServiceProcess) -> None:
    client = AsyncOpenAI(base_url=f"{smollm2_server.url}/v1", api_key="unused", timeout=300, max_retries=0)
    before = _stats(smollm2_server)["structured_outputs"]["mixed_decode_steps"]
    messages = [{"role": "user", "content": "List some colours."}]
    pattern = "(red|green|blue)(, (red|green|blue)){2,4}"
    constrained, free = await asyncio.gather(
        client.chat.completions.create(model="smollm2", temperature=0, max_tokens=30, messages=messages,
                                       extra_body={"structured_outputs": {"regex": pattern}}),
        client.chat.completions.create(model="smollm2", temperature=0, max_tokens=30, messages=messages))
    await client.close()
    assert re.fullmatch(pattern, constrained.choices[0].message.content)
    assert constrained.choices[0].finish_reason == "stop"
    assert free.choices[0].message.content != constrained.choices[0].message.content
    assert _stats(smollm2_server)["structured_outputs"]["mixed_decode_steps"] > before
