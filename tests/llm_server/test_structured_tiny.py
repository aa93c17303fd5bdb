"""Structured-output requests against `llm_server --model tiny` over HTTP: every malformed constraint is a
400 naming the field and the problem, and valid ones work on both routes (the random model only matches
because of the mask)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.helpers import ServiceProcess

PROMPT = [{"role": "user", "content": "go left"}]
TOOLS = [{"type": "function", "function": {"name": "move", "parameters": {
    "type": "object", "properties": {"to": {"enum": ["left", "right"]}}, "required": ["to"]}}}]


def _chat(server: ServiceProcess, **body: object) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", timeout=120,
                      json={"model": "tiny", "messages": PROMPT, "max_tokens": 40, **body})


@pytest.mark.parametrize(("body", "fragment"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
     "response_format is invalid: Invalid type: strin"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}}, "'/$defs/missing' does not exist"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema is required"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema is required"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}},
     "response_format: json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "response_format: type: Input should be"),
    ({"response_format": "json"}, "response_format: "),
    ({"structured_outputs": {"regex": "(("}}, "structured_outputs is invalid: at 1(8): invalid regex"),
    ({"structured_outputs": {"grammar": "start: foo"}}, "unknown name"),
    ({"structured_outputs": {"choice": []}}, "choice must be a non-empty list"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json is not valid JSON"),
    ({"structured_outputs": {"json": {}, "regex": "a"}}, "exactly one of json, regex, choice, grammar"),
    ({"structured_outputs": {"jsn": {}}}, "structured_outputs: jsn: Extra inputs are not permitted"),
    ({"structured_outputs": ["regex"]}, "structured_outputs must be an object"),
    ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
     "only one constraint per request: got response_format, structured_outputs"),
    ({"structured_outputs": {"regex": "a"}, "guided_regex": "b"}, "not both"),
    ({"tool_choice": "required"}, "needs tools: the request has none"),
    ({"tool_choice": {"type": "function", "function": {"name": "jump"}}, "tools": TOOLS},
     "tool_choice: tool_choice names 'jump', which is not among the request's tools"),
    ({"tool_choice": "sometimes", "tools": TOOLS}, "tool_choice must be 'none', 'auto', 'required'"),
])
def test_malformed_constraints_are_400s(tiny_server: ServiceProcess, body: dict, fragment: str) -> None:
    response = _chat(tiny_server, **body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_structured_output" and fragment in error["message"], error


def test_constraints_on_chat_and_completions(tiny_server: ServiceProcess) -> None:
    schema = {"type": "object", "properties": {"go": {"enum": ["left", "right"]}, "steps": {"type": "integer",
              "minimum": 1, "maximum": 9}}, "required": ["go", "steps"], "additionalProperties": False}
    chat = _chat(tiny_server, temperature=0.9, seed=3, n=2,
                 response_format={"type": "json_schema", "json_schema": {"name": "move", "schema": schema}}).json()
    for choice in chat["choices"]:
        answer = json.loads(choice["message"]["content"])
        assert answer["go"] in {"left", "right"} and 1 <= answer["steps"] <= 9 and choice["finish_reason"] == "stop"
    as_object = _chat(tiny_server, temperature=0, response_format={"type": "json_object"}).json()["choices"][0]
    if as_object["finish_reason"] == "stop":  # a random model may still be inside a string at max_tokens
        assert isinstance(json.loads(as_object["message"]["content"]), dict)
    assert as_object["message"]["content"].startswith("{")
    legacy = _chat(tiny_server, temperature=0, guided_choice=["north", "south"]).json()["choices"][0]
    assert legacy["message"]["content"] in {"north", "south"}
    tool = _chat(tiny_server, temperature=0, max_tokens=200, tools=TOOLS, tool_choice="required").json()["choices"][0]
    assert tool["finish_reason"] == "tool_calls" and tool["message"]["tool_calls"][0]["function"]["name"] == "move"
    completion = httpx.post(f"{tiny_server.url}/v1/completions", timeout=120, json={
        "model": "tiny", "prompt_token_ids": chat["prompt_token_ids"], "max_tokens": 10, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"enum": [1, 2, 3]}}}})
    assert completion.status_code == 200, completion.text
    assert completion.json()["choices"][0]["text"] in {"1", "2", "3"}
    stats = httpx.get(f"{tiny_server.url}/v1/stats", timeout=10).json()["structured_outputs"]
    assert stats["engine"] == "llguidance" and stats["constrained_rows"] >= 6 and stats["grammar_errors"] >= 1
