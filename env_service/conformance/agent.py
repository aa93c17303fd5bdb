"""A random agent for conformance episodes: random tool calls (from the tool docs) and random text.

It knows nothing about the environment beyond its tool docs; its job is to exercise the server
with every action format (python-style calls, `<tool_call>` blocks, plain text), not to win.
"""

from __future__ import annotations

import json
import random
from typing import Any

WORDS = ("0", "1", "2", "3", "left", "right", "up", "down", "north", "south", "east", "west", "pickup",
         "dropoff", "look", "help", "done", "I have finished.", "yes", "no")
STRINGS = ("a", "test", "document", "temp", "SFO", "JFK", "user_1", "", "hello world")


def random_value(schema: dict[str, Any], rng: random.Random, depth: int = 0) -> Any:
    kind = schema.get("type", "string")
    if "enum" in schema and schema["enum"]:
        return rng.choice(schema["enum"])
    if kind == "integer":
        return rng.randint(0, 10)
    if kind in ("number", "float"):
        return round(rng.uniform(0, 100), 2)
    if kind in ("boolean", "bool"):
        return rng.random() < 0.5
    if kind in ("array", "tuple", "list"):
        items = schema.get("items", {"type": "string"})
        return [] if depth > 1 else [random_value(items, rng, depth + 1) for _ in range(rng.randint(0, 2))]
    if kind in ("object", "dict"):
        return {} if depth > 1 else {name: random_value(sub, rng, depth + 1)
                                     for name, sub in (schema.get("properties") or {}).items()}
    return rng.choice(STRINGS)


class RandomAgent:
    def __init__(self, tools: list[dict[str, Any]], seed: int) -> None:
        self.rng = random.Random(seed)
        # Accept OpenAI tool schemas and bare function docs alike; ignore anything else.
        self.functions = [tool.get("function", tool) for tool in tools
                          if isinstance(tool, dict) and isinstance(tool.get("function", tool).get("name"), str)]

    def plain_text(self) -> dict[str, Any]:
        """A reply that calls no tool: what an untrained policy writes most of the time."""
        return {"role": "assistant", "content": self.rng.choice(WORDS[4:])}

    def malformed_call(self) -> dict[str, Any]:
        """A tool call cut off mid-way (unbalanced JSON): the environment must explain, never raise."""
        name = self.rng.choice(self.functions)["name"] if self.functions else "look"
        return {"role": "assistant", "content": f'<tool_call>{{"name": "{name}", "arguments": {{</tool_call>'}

    def opening(self, index: int) -> list[dict[str, Any]]:
        """The actions every episode starts with, a plain-text reply and a malformed call, in turns first
        (an environment whose episodes end after one step still meets both over two episodes)."""
        pair = [self.plain_text(), self.malformed_call()]
        return pair if index % 2 == 0 else pair[::-1]

    def action(self) -> dict[str, Any]:
        """One assistant message (a JSON-able dict)."""
        roll = self.rng.random()
        if not self.functions or roll < 0.3:
            return {"role": "assistant", "content": self.rng.choice(WORDS)}
        function = self.rng.choice(self.functions)
        parameters = function.get("parameters") or {}
        properties = parameters.get("properties") or {}
        required = set(parameters.get("required") or [])
        arguments = {name: random_value(schema, self.rng) for name, schema in properties.items()
                     if name in required or self.rng.random() < 0.3}
        if roll < 0.65:
            rendered = ", ".join(f"{key}={value!r}" for key, value in arguments.items())
            return {"role": "assistant", "content": f"[{function['name']}({rendered})]"}
        block = json.dumps({"name": function["name"], "arguments": arguments})
        return {"role": "assistant", "content": f"<tool_call>{block}</tool_call>"}
