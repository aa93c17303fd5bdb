"""A LangGraph ReAct agent for the flights desk (`langgraph`, `langchain-openai`). It imports nothing from evolver.

The same contract as `openai_flights.py`: evolver's agent runner calls `agent(task, base_url)` per episode, with
the episode's gateway URL and, under `task["env"]`, the flights instance made for it. The desk's tools become
LangChain tools that act on that instance; LangGraph's prebuilt ReAct loop calls them until the model replies in
plain text, which goes to the desk as the closing reply and is returned as the answer.
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
from langchain_core.tools import StructuredTool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent


def desk_tools(desk: httpx.AsyncClient, step_url: str, docs: list[dict[str, Any]]) -> list[StructuredTool]:
    """Each of the desk's OpenAI tool docs as a LangChain tool that steps the episode's instance."""

    def make(doc: dict[str, Any]) -> StructuredTool:
        name = doc["function"]["name"]

        async def run(**arguments: Any) -> str:
            call = {"id": f"call_{name}", "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)}}
            result = (await desk.post(step_url, json={"action": {"role": "assistant", "content": "",
                                                                  "tool_calls": [call]}})).json()
            return result["observation"]["content"]

        return StructuredTool.from_function(coroutine=run, name=name, description=doc["function"]["description"],
                                            args_schema=doc["function"]["parameters"])

    return [make(doc) for doc in docs]


async def agent(task: dict[str, Any], base_url: str, *, model: str = "gpt-4o-mini", max_tokens: int = 256,
                recursion_limit: int = 16) -> str:
    env = task["env"]
    step_url = f"/v1/instances/{env['instance_id']}/step"
    system, user = (m["content"] for m in env["messages"])
    llm = ChatOpenAI(model=model, base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "unused"),
                     max_tokens=max_tokens, max_retries=0)
    async with httpx.AsyncClient(base_url=env["url"], timeout=60) as desk:
        docs = (await desk.get(f"/v1/environments/{env['name']}/tools")).json()["tools"]
        graph = create_react_agent(llm, desk_tools(desk, step_url, docs), prompt=system)
        state = await graph.ainvoke({"messages": [("user", user)]}, {"recursion_limit": recursion_limit})
        answer = str(state["messages"][-1].content)
        await desk.post(step_url, json={"action": {"role": "assistant", "content": answer}})
    return answer
