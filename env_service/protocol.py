"""Request and response bodies of the clean /v1 API (shared by the server and `client.py`).

Each model is the documented body of one route in the OpenAPI document (`/docs`), with an example;
docs/environment-protocol.md explains them as a protocol any env server may speak.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from common.schemas import ChatMessage, Split, WireModel

_SYSTEM = {"role": "system", "content": "You book flights with the tools search_flight, book_ticket, cancel_order."}
_USER = {"role": "user", "content": "Book the cheapest flight from Oslo to Rome on 2025-05-02."}


def _example(example: dict[str, Any]) -> ConfigDict:
    return ConfigDict(json_schema_extra={"examples": [example]})


class CreateRequest(WireModel):
    model_config = _example({"env": "flights", "task_id": "flights-train-0001",
                             "params": {"query": "Find a flight to Rome, then cancel nothing."}})

    env: str = Field(min_length=1, description="an environment this server serves (GET /v1/environments)")
    task_id: str = Field(min_length=1, description="one of the environment's task ids (any split)")
    params: dict[str, Any] = Field(default_factory=dict, description=(
        "per-episode parameters. `query`: replaces the task's user query, keeping its initial state: how a "
        "synthetic task (a new question on its seed task's world) reaches the environment. An environment "
        "must show it as the user message; the conformance kit checks it"))
    instance_id: str | None = Field(default=None, min_length=1, max_length=200, description=(
        "a caller-chosen id makes the create idempotent: sent twice, the second answers 409"))


class CreateResponse(WireModel):
    model_config = _example({"instance_id": "inst_3f2a9c", "env": "flights", "task_id": "flights-train-0001",
                             "messages": [_SYSTEM, _USER]})

    instance_id: str
    env: str
    task_id: str
    messages: list[ChatMessage] = Field(description="exactly [system, user]: the episode's opening")
    host: dict[str, Any] | None = Field(default=None, description=(
        "where the instance runs, when the backend has more than one place (ray: actor, pid, node_id, node_ip)"))


class StepRequest(WireModel):
    model_config = _example({"action": {"role": "assistant", "content":
                                        '<tool_call>{"name": "search_flight", "arguments": '
                                        '{"origin": "Oslo", "destination": "Rome"}}</tool_call>'}})

    action: ChatMessage = Field(description=(
        "the policy's assistant message: OpenAI `tool_calls`, or text holding `<tool_call>{json}</tool_call>` "
        "or Python-style calls; common/actions.py parses all three"))


class StepResponse(WireModel):
    model_config = _example({"observation": {"role": "tool", "content": '[{"flight": "OS-RM-12", "price": 120}]'},
                             "reward": 0.0, "done": False, "info": {"valid": True}})

    observation: ChatMessage = Field(description="exactly one message: what the action led to")
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = Field(default_factory=dict, description=(
        "`valid: false` / `invalid: true` / `error`: the action was malformed (the policy's fault); "
        "`error.code == \"environment_error\"`: the environment itself failed and the episode ended"))


class EvaluateRequest(WireModel):
    model_config = _example({"params": {}})

    params: dict[str, Any] = Field(default_factory=dict, description="environment-specific grading options")


class EvaluateResponse(WireModel):
    model_config = _example({"score": 1.0, "info": {"booked": "OS-RM-12"}})

    score: float = Field(ge=0.0, le=1.0, description="the episode's outcome so far, in [0, 1]")
    info: dict[str, Any] = Field(default_factory=dict)


class StateResponse(WireModel):
    model_config = _example({"instance_id": "inst_3f2a9c", "state": {"orders": [{"flight": "OS-RM-12"}]},
                             "state_hash": "9c1d0e7a2b4f6a81"})

    instance_id: str
    state: dict[str, Any] | None = Field(description=(
        "a JSON snapshot of the verifiable world state, or null when the environment has none; a synthetic "
        "task is verified by comparing it with the state its replayed reference solution reached"))
    state_hash: str | None = Field(default=None, description=(
        "a canonical hash of `state` (equal states, equal hashes): GiGPO's anchor states"))


class ForkRequest(WireModel):
    model_config = _example({"instance_id": "inst_3f2a9c-branch"})

    instance_id: str | None = Field(default=None, min_length=1, max_length=200, description=(
        "a caller-chosen id for the copy makes the fork idempotent: sent twice, the second answers 409"))


class ForkResponse(WireModel):
    model_config = _example({"instance_id": "inst_7b41d0", "forked_from": "inst_3f2a9c", "env": "flights",
                             "task_id": "flights-train-0001", "steps": 3})

    instance_id: str = Field(description="the copy: a live instance like any other (step, evaluate, release it)")
    forked_from: str
    env: str
    task_id: str
    steps: int = Field(description="steps the original had taken: the copy continues from there")


class ReleaseResponse(WireModel):
    model_config = _example({"instance_id": "inst_3f2a9c", "released": True})

    instance_id: str
    released: bool = Field(description="False when it was not live (already released, reaped or never created)")


class EnvironmentSummary(WireModel):
    name: str
    splits: dict[str, int] = Field(description="split -> number of tasks")
    info: dict[str, Any] = Field(default_factory=dict)


class EnvironmentList(WireModel):
    model_config = _example({"environments": [{"name": "flights", "splits": {"train": 240, "validation": 60,
                                                                              "test": 60}}]})

    environments: list[EnvironmentSummary]


class EnvironmentDescription(WireModel):
    model_config = _example({"name": "flights", "info": {"name": "flights"},
                             "task_ids": {"train": ["flights-train-0001"], "validation": [], "test": []}})

    name: str
    info: dict[str, Any]
    task_ids: dict[str, list[str]] = Field(description="split -> task ids (deterministic)")


class TaskList(WireModel):
    model_config = _example({"env": "flights", "split": "train", "task_ids": ["flights-train-0001"]})

    env: str
    split: Split
    task_ids: list[str]


class EnvironmentProfile(WireModel):
    """AgentEvolver's profile shape: the input of self-questioning (what exists and what can be done)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [{
        "name": "flights", "background": "A flight booking system.",
        "entities": [{"name": "flight", "attrs": {"price": "in EUR"}, "operations": ["search", "book"]}],
        "task_preference": {"num_entities": 1, "num_operations": 2}}]})

    name: str
    background: str = ""
    entities: list[dict[str, Any]] = Field(default_factory=list)
    task_preference: dict[str, Any] = Field(default_factory=dict)


class ToolList(WireModel):
    model_config = _example({"env": "flights", "task_id": None, "tools": [
        {"type": "function", "function": {"name": "search_flight", "description": "Search flights",
                                          "parameters": {"type": "object", "properties": {
                                              "origin": {"type": "string"}}, "required": ["origin"]}}}]})

    env: str
    task_id: str | None
    tools: list[dict[str, Any]] = Field(description="OpenAI function schemas; empty for an environment without tools")


class ReferenceEpisode(WireModel):
    model_config = _example({"env": "flights", "task_id": "train-t1-0000", "messages": [
        {"role": "system", "content": "You are a travel agent..."},
        {"role": "user", "content": "How much travel credit does Chen Okafor have?"},
        {"role": "assistant", "content": "<tool_call>{\"name\": \"get_passenger\", \"arguments\": "
                                         "{\"name\": \"Chen Okafor\"}}</tool_call>"},
        {"role": "tool", "content": "{\"passenger_id\": \"P4821\", \"travel_credit\": 4295}"},
        {"role": "assistant", "content": "The answer is 4295."}]})

    env: str
    task_id: str
    messages: list[dict[str, Any]] = Field(description="the train task solved by its reference calls, observations "
                                                       "as the environment answered them, and the closing reply")


class InstanceDescription(WireModel):
    model_config = _example({"instance_id": "inst_3f2a9c", "env": "flights", "task_id": "flights-train-0001",
                             "age_s": 2.5, "idle_s": 0.4, "steps": 3, "host": None})

    instance_id: str
    env: str
    task_id: str
    age_s: float
    idle_s: float
    steps: int
    host: dict[str, Any] | None = Field(default=None, description="where it runs (the ray backend's actor)")


class InstanceList(WireModel):
    model_config = _example({"stats": {"live": 1, "creating": 0, "max_instances": 2048, "backend": "inline"},
                             "instances": [{"instance_id": "inst_3f2a9c", "env": "flights",
                                            "task_id": "flights-train-0001", "age_s": 2.5, "idle_s": 0.4,
                                            "steps": 3}]})

    stats: dict[str, Any]
    instances: list[dict[str, Any]]
