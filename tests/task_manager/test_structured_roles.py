"""The LLM roles' JSON schemas (explorer call, synthesizer tasks, summarizer experiences, judge labels): the
bundled server's grammar engine accepts them, and the answers they allow parse into the roles' objects."""

from __future__ import annotations

import json

import llguidance
import pytest

from engine.grammar import json_schema_grammar
from env_service.environments.flights.desk import tool_docs
from experience_manager.summarize import MERGE_SCHEMA, experience_schema, parse_items
from judge.structured import label_schema
from task_manager.explore import _structured_call
from task_manager.profile import call_schema
from task_manager.synthesize import parse_task_blocks, task_schema

TOOLS = tool_docs()


@pytest.mark.parametrize("schema", [call_schema(TOOLS), task_schema(TOOLS), experience_schema(3), MERGE_SCHEMA,
                                    label_schema(6, 200), label_schema(60, 0)],
                         ids=["call", "tasks", "experiences", "merge", "labels", "labels-long"])
def test_the_grammar_engine_accepts_every_role_schema(schema):
    assert llguidance.LLMatcher.validate_grammar(json_schema_grammar(schema)) == ""  # "" is no error


def test_call_schema_allows_only_documented_tools_with_their_parameters():
    schema = call_schema(TOOLS)
    names = [option["properties"]["name"]["const"] for option in schema["anyOf"]]
    assert names == [doc["function"]["name"] for doc in TOOLS]
    search = schema["anyOf"][names.index("search_flight")]["properties"]["arguments"]
    assert search["required"] == ["origin", "destination"]
    call = _structured_call(json.dumps({"name": "search_flight", "arguments": {"origin": "SFO", "destination": "JFK"}}))
    assert call is not None and call.render().startswith("<tool_call>")
    assert _structured_call('{"name": "search_flight", "argu') is None  # cut off by the token limit


def test_structured_synthesizer_answer_parses_each_task():
    answer = {"tasks": [
        {"query": "Book the cheapest flight from SFO to JFK on June 3 for Ann Lee.", "confidence": 0.8,
         "action_sequence": [{"name": "search_flight", "arguments": {"origin": "SFO", "destination": "JFK"}},
                             {"name": "book_ticket", "arguments": {"passenger_id": "P1001", "flight_id": "UA1"}}]},
        {"query": "", "confidence": 0.5, "action_sequence": []}]}
    written, parsed = parse_task_blocks(json.dumps(answer))
    assert written == 2 and len(parsed) == 1
    assert parsed[0]["confidence"] == 0.8 and len(parsed[0]["actions"]) == 2
    assert parsed[0]["actions"][0].startswith('<tool_call>{"name": "search_flight"')
    cut = json.dumps(answer)[:json.dumps(answer).index('{"query": ""') + 20]  # stopped by the token limit
    assert parse_task_blocks(cut) == (2, parsed)
    # the free-text path is unchanged
    text = '<task>{"query": "q", "confidence": 0.5, "action_sequence": ["a(x=1)", "b(y=2)"]}</task>'
    assert parse_task_blocks(text) == (1, [{"query": "q", "confidence": 0.5, "actions": ["a(x=1)", "b(y=2)"]}])


def test_structured_summarizer_answer_parses():
    answer = {"experiences": [{"when_to_use": "When a booking needs a flight id", "confidence": 0.7,
                               "experience": "Search the route first and book with an id from the results.",
                               "tags": ["booking"], "tools_used": ["search_flight", "book_ticket"]}]}
    items, problem = parse_items(json.dumps(answer), "Book a flight from SFO to JFK", 3)
    assert problem is None and len(items) == 1 and items[0]["tools_used"] == ["search_flight", "book_ticket"]
