"""AgentEvolver-compatible routes, with its request/response shapes and conventions.

Every route takes AgentEvolver's `ServiceRequest` body `{env_type, task_id, instance_id, messages,
params}` and answers `{"success": bool, "data": ...}`. Errors keep that shape too
(`success: false`, the message in `message` and FastAPI's `detail`), with proper HTTP statuses.
Its implicit contracts hold: create returns exactly [system, user]; a step returns one message.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, ValidationError

from common.schemas import ChatMessage
from common.service import ErrorInfo, ORJSONResponse, ServiceError, add_error_renderer
from env_service.environments.base import SPLITS
from env_service.manager import InstanceManager

COMPAT_PATHS = frozenset({"/create", "/step", "/evaluate", "/release", "/get_env_profile", "/get_info"})


class AgentEvolverRequest(BaseModel):
    """AgentEvolver's ServiceRequest; unknown fields are ignored as AgentEvolver does."""

    model_config = ConfigDict(extra="ignore")

    env_type: str | None = None
    task_id: str | None = None
    instance_id: str | None = None
    messages: dict[str, Any] | list[dict[str, Any]] = {}
    params: dict[str, Any] = {}


class CompatError(BaseModel):
    """An error on the AgentEvolver routes: its `success: false` shape, `detail` a plain string."""

    success: bool
    data: None = None
    message: str
    detail: str
    error: ErrorInfo


def render_compat_error(path: str, status: int, code: str, message: str, details: Any) -> dict | None:
    if path not in COMPAT_PATHS:
        return None
    return {"success": False, "data": None, "message": message, "detail": message,
            "error": {"code": code, "message": message, "details": details}}


def _require(value: str | None, field: str) -> str:
    if not value:
        raise ServiceError(400, "missing_field", f"{field} is required", {"field": field})
    return value


def _action(messages: dict[str, Any] | list[dict[str, Any]]) -> ChatMessage:
    if isinstance(messages, list):  # tolerate a list: the last message is the action
        if not messages:
            raise ServiceError(422, "validation_error", "messages: the assistant action is missing",
                               [{"field": "messages", "message": "empty list"}])
        messages = messages[-1]
    try:
        return ChatMessage.model_validate({"role": "assistant", **messages})
    except ValidationError as exc:
        problems = [{"field": ".".join(["messages", *map(str, e["loc"])]), "message": e["msg"]}
                    for e in exc.errors()]
        summary = "; ".join(f"{p['field']}: {p['message']}" for p in problems[:5])
        raise ServiceError(422, "validation_error", f"invalid action: {summary}", problems) from None


def add_compat_routes(app: FastAPI, manager: InstanceManager) -> None:
    add_error_renderer(app, render_compat_error, COMPAT_PATHS, CompatError)

    @app.post("/get_env_profile", tags=["agentevolver"])
    async def get_env_profile(body: AgentEvolverRequest) -> ORJSONResponse:
        env = manager.environment(_require(body.env_type, "env_type"))
        split = body.params.get("split", "train")
        if split not in SPLITS:
            raise ServiceError(422, "validation_error", f"params.split must be one of {', '.join(SPLITS)}, "
                               f"got {split!r}", [{"field": "params.split", "message": "unknown split"}])
        return ORJSONResponse({"success": True, "data": env.task_ids(split)})

    @app.post("/create", tags=["agentevolver"])
    async def create(body: AgentEvolverRequest) -> ORJSONResponse:
        env_type = _require(body.env_type, "env_type")
        task_id = _require(body.task_id, "task_id")
        record, messages = await manager.create(env_type, task_id, body.params, body.instance_id)
        state = [m.model_dump(exclude_none=True) for m in messages]
        info = {"instance_id": record.instance_id, "task_id": task_id, "env_type": env_type}
        return ORJSONResponse({"success": True, "data": {"state": state, "info": info}})

    @app.post("/step", tags=["agentevolver"])
    async def step(body: AgentEvolverRequest) -> ORJSONResponse:
        instance_id = _require(body.instance_id, "instance_id")
        result = await manager.step(instance_id, _action(body.messages))
        info = {"instance_id": instance_id, **result.info}
        return ORJSONResponse({"success": True, "data": {
            "state": [result.observation.model_dump(exclude_none=True)], "reward": result.reward,
            "is_terminated": result.done, "info": info}})

    @app.post("/evaluate", tags=["agentevolver"])
    async def evaluate(body: AgentEvolverRequest) -> ORJSONResponse:
        result = await manager.evaluate(_require(body.instance_id, "instance_id"), body.params)
        return ORJSONResponse({"success": True, "data": result.score})

    @app.post("/get_info", tags=["agentevolver"])
    async def get_info(body: AgentEvolverRequest) -> ORJSONResponse:
        # AgentEvolver answers a tool-description string; ours is the JSON of the OpenAI tool schemas.
        if body.instance_id:
            record = manager.record(body.instance_id)
            env, task_id = manager.environment(record.env), record.task_id
        else:
            env, task_id = manager.environment(_require(body.env_type, "env_type or instance_id")), body.task_id
        return ORJSONResponse({"success": True, "data": json.dumps(env.tool_docs(task_id))})

    @app.post("/release", tags=["agentevolver"])
    async def release(body: AgentEvolverRequest) -> ORJSONResponse:
        existed = await manager.release(_require(body.instance_id, "instance_id"))
        return ORJSONResponse({"success": existed, "data": None})
