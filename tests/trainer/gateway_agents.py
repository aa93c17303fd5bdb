"""Agents for the gateway tests: plain `openai` SDK loops on a one-tool task, as a user would write them."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai

TOOLS = [{"type": "function", "function": {"name": "move", "parameters": {
    "type": "object", "properties": {"to": {"enum": ["left", "right"]}}, "required": ["to"],
    "additionalProperties": False}}}]


async def _loop(task: dict[str, Any], base_url: str, *, rewrite: bool, tool_choice: str = "required"
                ) -> dict[str, Any]:
    """Two forced tool calls (a random model calls no tool by itself), then a reply; the answer is where it moved.
    `rewrite`: before each call the history is folded into one user message, as summarising agents do.
    `tool_choice` auto: the model decides (the loop ends at its first reply without a call)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You move."},
                                      {"role": "user", "content": task["query"]}]
    moves: list[str] = []
    for _ in range(2):
        reply = (await client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS,
                                                      tool_choice=tool_choice, max_tokens=40)).choices[0].message
        if not reply.tool_calls:
            break
        call = reply.tool_calls[0]
        moves.append("left" if "left" in call.function.arguments else "right")
        if rewrite:
            messages = [messages[0], {"role": "user", "content": f"{task['query']} (moved {', '.join(moves)})"}]
        else:
            messages += [reply.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": f"you are {moves[-1]}"}]
    await client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=4)
    await client.close()
    return {"answer": moves}


async def agent(task: dict[str, Any], base_url: str) -> dict[str, Any]:
    return await _loop(task, base_url, rewrite=False)


async def auto_agent(task: dict[str, Any], base_url: str) -> dict[str, Any]:
    """Leaves the choice of a tool to the model (`tool_choice: auto`), as most agents do."""
    return await _loop(task, base_url, rewrite=False, tool_choice="auto")


async def rewriting_agent(task: dict[str, Any], base_url: str) -> dict[str, Any]:
    return await _loop(task, base_url, rewrite=True)


async def crashing_agent(task: dict[str, Any], base_url: str) -> dict[str, Any]:
    if task.get("crash"):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        raise RuntimeError("the agent's own bug")
    return await _loop(task, base_url, rewrite=False)


def share_of_left(task: dict[str, Any], answer: list[str]) -> float:
    """Partial credit: the share of moves that went left."""
    return sum(move == "left" for move in answer) / max(len(answer), 1)


def words_credit(task: dict[str, Any], answer: str) -> float:
    """Partial credit: the share of the reply's characters that are letters. A random model's replies differ in
    it even when every one runs to the token budget, where a length cap would give them all the same credit."""
    text = str(answer or "")
    return sum(c.isalpha() for c in text) / len(text) if text else 0.0


async def hanging_agent(task: dict[str, Any], base_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    await asyncio.Event().wait()  # never set: only the runner's timeout ends this episode


# A command-line agent: the task on stdin, the base URL in OPENAI_BASE_URL, its reward on the last stdout line.
COMMAND_AGENT = """
import json, sys, openai
task = json.load(sys.stdin)
client = openai.OpenAI(max_retries=0)
reply = client.chat.completions.create(model="any", messages=[{"role": "user", "content": task["query"]}],
                                       max_tokens=3)
print("some log line")
print(json.dumps({"reward": 0.25 if task["task_id"] == "a" else 0.75}))
"""



async def blind_flights_agent(task: dict[str, Any], base_url: str) -> str | None:
    """A flights agent whose tool layer is broken: every tool call answers `[]` without reaching the desk. Its runs
    of a reference never reach it."""
    env = task["env"]
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    async with httpx.AsyncClient(base_url=env["url"], timeout=60) as desk:
        tools = (await desk.get(f"/v1/environments/{env['name']}/tools")).json()["tools"]
        messages: list[dict[str, Any]] = list(env["messages"])
        try:
            for _ in range(4):
                reply = (await client.chat.completions.create(model="any", messages=messages, tools=tools,
                                                              max_tokens=64)).choices[0].message
                messages.append(reply.model_dump(exclude_none=True))
                if not reply.tool_calls:
                    await desk.post(f"/v1/instances/{env['instance_id']}/step",
                                    json={"action": {"role": "assistant", "content": reply.content or ""}})
                    return reply.content
                messages += [{"role": "tool", "tool_call_id": c.id, "content": "[]"} for c in reply.tool_calls]
            return None
        finally:
            await client.close()


async def short_flights_agent(task: dict[str, Any], base_url: str) -> str | None:
    """The flights example with a short reply budget and few turns, as a test of the tiny model runs it."""
    from examples.agents.openai_flights import agent

    return await agent(task, base_url, max_tokens=24, max_turns=2)
