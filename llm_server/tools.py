"""Tool calls in generated text: Hermes-style `<tool_call>{json}</tool_call>` blocks, as rendered by
the chat template in engine.models, parsed back into OpenAI `tool_calls`."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable

TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


def random_call_id(position: int) -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_tool_calls(text: str, call_id: Callable[[int], str] = random_call_id) -> tuple[str, list[dict]]:
    """Hermes-style `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks -> OpenAI tool_calls.

    Blocks that are not valid JSON with a string `name` stay in the content. `call_id(position)` names each
    call (the gateway gives ids it recognises when the agent sends the call back).
    """
    calls: list[dict] = []
    kept: list[str] = []
    last = 0
    for match in TOOL_CALL.finditer(text):
        try:
            payload = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            continue
        arguments = payload.get("arguments", {})
        kept.append(text[last:match.start()])
        last = match.end()
        calls.append({"id": call_id(len(calls)), "type": "function",
                      "function": {"name": payload["name"],
                                   "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
    kept.append(text[last:])
    return "".join(kept).strip(), calls
