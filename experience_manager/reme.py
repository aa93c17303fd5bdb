"""The ReMe-compatible task-memory routes (what AgentEvolver calls), answered in ReMe's shapes."""

from __future__ import annotations

import datetime
import json
from typing import Any

from fastapi import APIRouter

from common.service import ServiceError
from experience_manager.durable import body_digest
from experience_manager.protocol import ReMeRetrieveRequest, ReMeSummaryRequest
from experience_manager.routes import Engine, check_trajectory_count
from experience_manager.trajectories import build_view

REME_PATHS = frozenset({"/summary_task_memory", "/retrieve_task_memory"})


def _reme_time(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def reme_memory(experience: dict[str, Any], similarity: float | None = None) -> dict[str, Any]:
    """An experience in ReMe's TaskMemory shape."""
    metadata = {"kind": experience.get("kind"), "tags": experience.get("tags", []),
                "tools_used": experience.get("tools", []), "utility": experience.get("utility"),
                "similarity": similarity}
    return {"workspace_id": experience.get("workspace_id", ""), "memory_id": experience["experience_id"],
            "memory_type": "task", "when_to_use": experience["when_to_use"], "content": experience["content"],
            "score": experience.get("quality", 0.0), "time_created": _reme_time(experience.get("created_at", 0.0)),
            "time_modified": _reme_time(experience.get("updated_at", 0.0)),
            "author": experience.get("author") or (experience.get("provenance") or {}).get("author", ""),
            "metadata": {k: v for k, v in metadata.items() if v is not None}}


def reme_error(path: str, status: int, code: str, message: str, details: Any) -> dict | None:
    if path not in REME_PATHS:
        return None
    return {"answer": message, "messages": [], "success": False,
            "metadata": {"error": {"code": code, "message": message, "details": details}}}


router = APIRouter(tags=["reme"])


@router.get("/health")
async def reme_health() -> dict:
    return {"status": "healthy"}


@router.post("/summary_task_memory")
async def summary_task_memory(body: ReMeSummaryRequest, engine: Engine) -> dict:
    check_trajectory_count(engine, len(body.trajectories))
    summary = engine.settings.summary
    views = [build_view(messages=[m.as_sent() for m in t.messages], reward=t.score,
                        success_threshold=summary.success_threshold, trajectory_id=None, task_id=t.task_id,
                        query=t.query) for t in body.trajectories]
    digest = body_digest(body.model_dump(mode="json"))
    result = await engine.ingest.summarize(body.workspace_id, views, mode=summary.mode, request_id=None,
                                           digest=digest)
    memories = [reme_memory({**e, "author": e["provenance"]["author"]}) for e in result["experiences"]]
    return {"answer": json.dumps(memories, ensure_ascii=False), "messages": [], "success": True,
            "metadata": {"memory_list": memories,
                         "update_result": {"deleted_count": 0, "inserted_count": len(result["created"]),
                                           "updated_count": len(result["updated"])},
                         "mode_used": result["mode_used"], "errors": result["errors"]}}


@router.post("/retrieve_task_memory")
async def retrieve_task_memory(body: ReMeRetrieveRequest, engine: Engine) -> dict:
    if body.query is None and body.messages is None:
        raise ServiceError(422, "missing_query", "query or messages is required!")
    engine.store.check_workspace_id(body.workspace_id)
    if body.workspace_id not in engine.store.indexes:
        # ReMe answers an empty workspace with an empty answer: AgentEvolver retrieves before any summary.
        return {"answer": "", "messages": [], "success": True, "metadata": {"memory_list": []}}
    query = body.query if body.query is not None else json.dumps([m.as_sent() for m in body.messages])
    result = await engine.retrieval.retrieve(body.workspace_id, query, top_k=body.top_k)
    memories = [reme_memory({**e, "workspace_id": body.workspace_id}, e["similarity"])
                for e in result["experiences"]]
    return {"answer": result["rendered"], "messages": [], "success": True,
            "metadata": {"memory_list": memories, "query": result["query"]}}
