"""A plain `openai` SDK tool-calling agent for the flights desk. It imports nothing from evolver.

evolver's agent runner calls `agent(task, base_url)` once per episode: `base_url` is the gateway's episode URL
(any OpenAI-compatible server works the same), and `task["env"]` names the flights instance the runner created
for this episode: its service URL, instance id, environment name and opening messages (the desk's instructions
and the passenger's request). The tools are the desk's own, run through that service.

    python -m examples.agents.openai_flights BASE_URL < task.json     # one episode by hand
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import httpx
import openai


async def agent(task: dict[str, Any], base_url: str, *, model: str = "gpt-4o-mini", tool_choice: str = "auto",
                max_turns: int = 8, max_tokens: int = 256, seed: int | None = None) -> str | None:
    """Call tools until the model replies in plain text; that reply (the desk grades it) is the answer."""
    env = task["env"]
    step_url = f"/v1/instances/{env['instance_id']}/step"
    client = openai.AsyncOpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "unused"))
    async with httpx.AsyncClient(base_url=env["url"], timeout=60) as desk:
        tools = (await desk.get(f"/v1/environments/{env['name']}/tools")).json()["tools"]
        messages: list[dict[str, Any]] = list(env["messages"])
        try:
            for _ in range(max_turns):
                response = await client.chat.completions.create(model=model, messages=messages, tools=tools,
                                                                tool_choice=tool_choice, max_tokens=max_tokens,
                                                                seed=seed)
                reply = response.choices[0].message
                messages.append(reply.model_dump(exclude_none=True))
                if not reply.tool_calls:
                    await desk.post(step_url, json={"action": {"role": "assistant", "content": reply.content or ""}})
                    return reply.content
                for call in reply.tool_calls:
                    action = {"role": "assistant", "content": "", "tool_calls": [call.model_dump()]}
                    result = (await desk.post(step_url, json={"action": action})).json()
                    messages.append({"role": "tool", "tool_call_id": call.id,
                                     "content": result["observation"]["content"]})
                    if result["done"]:
                        return None
            return None
        finally:
            await client.close()


if __name__ == "__main__":
    print(json.dumps({"answer": asyncio.run(agent(json.load(sys.stdin), sys.argv[1]))}))
