"""Request and response bodies of the clean /v1 API (shared by the server and `client.py`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from common.schemas import ChatMessage, Split, WireModel


class CreateRequest(WireModel):
    env: str = Field(min_length=1)
    task_id: str = Field(min_length=1)
    # `query` replaces the task's user query (a synthesized task on its seed task's initial state).
    params: dict[str, Any] = Field(default_factory=dict)
    instance_id: str | None = Field(default=None, min_length=1, max_length=200)


class CreateResponse(WireModel):
    instance_id: str
    env: str
    task_id: str
    messages: list[ChatMessage]  # exactly [system, user]


class StepRequest(WireModel):
    action: ChatMessage


class StepResponse(WireModel):
    observation: ChatMessage
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


class EvaluateRequest(WireModel):
    params: dict[str, Any] = Field(default_factory=dict)


class EvaluateResponse(WireModel):
    score: float = Field(ge=0.0, le=1.0)
    info: dict[str, Any] = Field(default_factory=dict)


class StateResponse(WireModel):
    instance_id: str
    state: dict[str, Any] | None
    state_hash: str | None = None


class ReleaseResponse(WireModel):
    instance_id: str
    released: bool  # False when it was not live (already released, reaped or never created)


class EnvironmentSummary(WireModel):
    name: str
    splits: dict[str, int]  # split -> number of tasks
    info: dict[str, Any] = Field(default_factory=dict)


class TaskList(WireModel):
    env: str
    split: Split
    task_ids: list[str]
