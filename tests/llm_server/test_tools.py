"""The llm_server's tool-call parser: Hermes-style blocks in generated text back into OpenAI `tool_calls`."""

from __future__ import annotations

from llm_server.tools import parse_tool_calls


def test_parse_tool_calls() -> None:
    text = 'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"city": "Paris"}}\n</tool_call>' \
           '<tool_call>{"name": "book", "arguments": "{\\"id\\": 3}"}</tool_call><tool_call>{not json}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert [c["function"]["name"] for c in calls] == ["search", "book"]
    assert calls[0]["function"]["arguments"] == '{"city": "Paris"}' and calls[1]["function"]["arguments"] == '{"id": 3}'
    assert content == "Let me look.\n<tool_call>{not json}</tool_call>"
    assert parse_tool_calls("plain answer") == ("plain answer", [])
