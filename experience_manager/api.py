"""HTTP routes: the `/v1/workspaces/{ws}/...` API and the ReMe-compatible task-memory routes."""

from __future__ import annotations

import datetime
import json
import math
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, Query
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from common.schemas import ChatMessage, ExperienceKind, ExperienceUsage, Provenance, Trajectory, WireModel
from common.service import ServiceError, add_error_renderer, create_app
from experience_manager.durable import body_digest
from experience_manager.engine import ExperienceEngine
from experience_manager.settings import ExperienceManagerSettings
from experience_manager.text import ID_PATTERN, REQUEST_ID_PATTERN, forbidden_markup, valid_id
from experience_manager.trajectories import build_view, view_of_trajectory

REME_PATHS = frozenset({"/summary_task_memory", "/retrieve_task_memory"})
RequestId = Field(default=None, pattern=REQUEST_ID_PATTERN,
                  description="makes the mutation idempotent: a retry with the same id returns the first answer")


def _clean(value: str, name: str) -> str:
    marker = forbidden_markup(value)
    if marker:
        raise ValueError(f"{name} contains {marker!r}: injection markers and chat special tokens are not "
                         f"allowed (they would break experience stripping in the trainer)")
    return value


# ---------------------------------------------------------------- /v1 request models


class SummarizeRequest(WireModel):
    trajectories: list[Trajectory] = Field(min_length=1)
    mode: Literal["auto", "llm", "heuristic"] | None = None
    request_id: str | None = RequestId
    run_async: bool = Field(default=False, alias="async", description="run as a job; poll GET /v1/jobs/{job_id}")


class RetrieveRequest(WireModel):
    query: str | None = Field(default=None, min_length=1, max_length=100_000)
    messages: list[dict[str, Any]] | None = None
    top_k: int | None = Field(default=None, ge=1, le=50)
    min_similarity: float | None = Field(default=None, ge=-1.0, le=2.0)
    exclude_ids: list[str] = Field(default_factory=list, max_length=1000)
    # The task's kind (the task manager's `metadata.task_kind`), when known: experiences of that kind rank first.
    task_kind: str | None = Field(default=None, min_length=1, max_length=500)

    @model_validator(mode="after")
    def _one_query(self) -> RetrieveRequest:
        if (self.query is None) == (self.messages is None):
            raise ValueError("give exactly one of `query` (the task text) or `messages` (the initial chat messages)")
        return self


class BatchRetrieveRequest(WireModel):
    queries: list[str] = Field(min_length=1, max_length=512)
    top_k: int | None = Field(default=None, ge=1, le=50)
    min_similarity: float | None = Field(default=None, ge=-1.0, le=2.0)
    exclude_ids: list[str] = Field(default_factory=list, max_length=1000)


def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


class FeedbackItem(WireModel):
    experience_ids: list[str] = Field(min_length=1, max_length=50)
    reward: float
    success: bool | None = Field(default=None, description="default: reward >= summary.success_threshold")
    baseline: float | None = Field(default=None, description="mean reward of the same task's no-experience rollouts")

    @field_validator("reward", "baseline")
    @classmethod
    def _finite_numbers(cls, value: float | None) -> float | None:
        return _finite(value)

    @field_validator("experience_ids")
    @classmethod
    def _ids(cls, ids: list[str]) -> list[str]:
        bad = [i for i in ids if not valid_id(i)]
        if bad:
            raise ValueError(f"experience ids must match {ID_PATTERN}: {bad[:3]}")
        return ids


class FeedbackRequest(WireModel):
    items: list[FeedbackItem] = Field(min_length=1, max_length=10_000)
    request_id: str | None = RequestId


class ExperienceCreate(WireModel):
    when_to_use: str = Field(min_length=1, max_length=1000)
    content: str = Field(min_length=1, max_length=4000)
    kind: ExperienceKind = ExperienceKind.manual
    tags: list[str] = Field(default_factory=list, max_length=20)
    tools: list[str] = Field(default_factory=list, max_length=50)
    quality: float = Field(default=0.5, ge=0.0, le=1.0)
    task_ids: list[str] = Field(default_factory=list, max_length=10)
    author: str | None = Field(default=None, max_length=100)
    request_id: str | None = RequestId

    @field_validator("when_to_use", "content")
    @classmethod
    def _no_markup(cls, value: str, info) -> str:
        return _clean(value, info.field_name)


class ExperiencePatch(WireModel):
    when_to_use: str | None = Field(default=None, min_length=1, max_length=1000)
    content: str | None = Field(default=None, min_length=1, max_length=4000)
    kind: ExperienceKind | None = None
    tags: list[str] | None = Field(default=None, max_length=20)
    tools: list[str] | None = Field(default=None, max_length=50)
    quality: float | None = Field(default=None, ge=0.0, le=1.0)
    status: Literal["active", "archived"] | None = None
    request_id: str | None = RequestId

    @field_validator("when_to_use", "content")
    @classmethod
    def _no_markup(cls, value: str | None, info) -> str | None:
        return None if value is None else _clean(value, info.field_name)


class ImportItem(BaseModel):
    """An experience from an export; stored fields we recompute (hash, vectors, workspace) are ignored."""

    model_config = ConfigDict(extra="ignore")
    experience_id: str | None = Field(default=None, pattern=ID_PATTERN)
    when_to_use: str = Field(min_length=1, max_length=1000)
    content: str = Field(min_length=1, max_length=4000)
    kind: ExperienceKind = ExperienceKind.manual
    tags: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    quality: float = Field(default=0.5, ge=0.0, le=1.0)
    support: int = Field(default=1, ge=1)
    provenance: Provenance | None = None
    usage: ExperienceUsage | None = None
    status: Literal["active", "archived"] | None = None
    created_at: float | None = None
    demonstration: list[ChatMessage] | None = Field(default=None, max_length=64)

    @field_validator("when_to_use", "content")
    @classmethod
    def _no_markup(cls, value: str, info) -> str:
        return _clean(value, info.field_name)

    @field_validator("demonstration")
    @classmethod
    def _clean_demonstration(cls, demo: list[ChatMessage] | None) -> list[ChatMessage] | None:
        # Replayed as chat turns by `inject: turns`: a special token would break the chat template.
        for n, message in enumerate(demo or []):
            _clean(message.text(), f"demonstration[{n}].content")
        return demo


class ImportRequest(WireModel):
    experiences: list[ImportItem] = Field(max_length=100_000)
    keep_usage: bool = True
    request_id: str | None = RequestId


class ExportRequest(WireModel):
    include_archived: bool = True
    write_file: bool = Field(default=False, description="also write <store>/exports/<ws>.jsonl atomically")


class PruneRequest(WireModel):
    dry_run: bool = False
    request_id: str | None = RequestId


# ---------------------------------------------------------------- ReMe-compatible models


class ReMeMessage(BaseModel):
    """An OpenAI-style chat message as ReMe takes it: any other keys pass through, but the fields read here
    must have their types (a `tool_calls: 5` is refused naming the field, not stored as a call-less step)."""
    model_config = ConfigDict(extra="allow")
    role: str | None = None
    content: str | list[dict[str, Any]] | None = None  # text, or OpenAI content parts
    tool_calls: list[dict[str, Any]] | None = None

    def as_sent(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class ReMeTrajectory(BaseModel):
    model_config = ConfigDict(extra="allow")
    messages: list[ReMeMessage] = Field(min_length=1)
    score: float = 0.0
    task_id: str | None = None
    query: str | None = None


class ReMeSummaryRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # ReMe flows take free-form JSON
    workspace_id: str = "default"
    trajectories: list[ReMeTrajectory] = Field(min_length=1)


class ReMeRetrieveRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    workspace_id: str = "default"
    query: str | None = None
    messages: list[ReMeMessage] | None = None
    top_k: int = Field(default=3, ge=1, le=50)


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


class ReMeError(BaseModel):
    """An error on the ReMe-compatible routes, in ReMe's response shape."""

    answer: str
    messages: list[Any]
    success: bool
    metadata: dict[str, Any]


def reme_error(path: str, status: int, code: str, message: str, details: Any) -> dict | None:
    if path not in REME_PATHS:
        return None
    return {"answer": message, "messages": [], "success": False,
            "metadata": {"error": {"code": code, "message": message, "details": details}}}


# ---------------------------------------------------------------- the app


def build_app(settings: ExperienceManagerSettings, engine: ExperienceEngine | None = None) -> FastAPI:
    engine = engine or ExperienceEngine(settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await engine.start()
        try:
            yield
        finally:
            await engine.close()

    app = create_app("experience_manager", description="Distill, store, retrieve and score agent experiences.",
                     ready=lambda: engine.ready, max_body_bytes=settings.max_body_bytes, lifespan=lifespan)
    app.state.engine = engine
    add_error_renderer(app, reme_error, REME_PATHS, ReMeError)
    threshold = settings.summary.success_threshold

    def check_limit(n: int) -> None:
        if n > settings.summary.max_trajectories:
            raise ServiceError(422, "too_many_trajectories", f"{n} trajectories in one request; the limit is "
                                                             f"summary.max_trajectories={settings.summary.max_trajectories}")

    # ------------------------------------------------------------ workspaces

    @app.get("/v1/workspaces", tags=["workspaces"])
    async def list_workspaces() -> dict:
        return {"workspaces": engine.list_workspaces()}

    @app.put("/v1/workspaces/{ws}", tags=["workspaces"])
    async def create_workspace(ws: str) -> dict:
        return await engine.create_workspace(ws)

    @app.delete("/v1/workspaces/{ws}", tags=["workspaces"])
    async def delete_workspace(ws: str, request_id: str | None = Query(default=None, pattern=REQUEST_ID_PATTERN)
                               ) -> dict:
        return await engine.drop_workspace(ws, request_id=request_id)

    @app.get("/v1/workspaces/{ws}/stats", tags=["workspaces"])
    async def stats(ws: str) -> dict:
        return engine.workspace_stats(ws)

    # ------------------------------------------------------------ summarize, retrieve, feedback

    @app.post("/v1/workspaces/{ws}/summarize", tags=["experiences"])
    async def summarize(ws: str, body: SummarizeRequest) -> dict:
        check_limit(len(body.trajectories))
        views = [view_of_trajectory(t, threshold) for t in body.trajectories]
        mode = body.mode or settings.summary.mode
        # Only what the client sent: server-side defaults (fresh trajectory ids) must not change the digest.
        digest = body_digest(body.model_dump(mode="json", exclude={"request_id", "run_async"}, exclude_unset=True))
        if body.run_async:
            return engine.ingest.start_summarize_job(ws, views, mode=mode, request_id=body.request_id, digest=digest)
        return await engine.ingest.summarize(ws, views, mode=mode, request_id=body.request_id, digest=digest)

    @app.get("/v1/jobs/{job_id}", tags=["experiences"])
    async def job(job_id: str) -> dict:
        return engine.ingest.job(job_id)

    @app.post("/v1/workspaces/{ws}/retrieve", tags=["experiences"])
    async def retrieve(ws: str, body: RetrieveRequest) -> dict:
        query = body.query if body.query is not None else json.dumps(body.messages)
        return await engine.retrieval.retrieve(ws, query, top_k=body.top_k, min_similarity=body.min_similarity,
                                     exclude_ids=body.exclude_ids, task_kind=body.task_kind)

    @app.post("/v1/workspaces/{ws}/retrieve:batch", tags=["experiences"])
    async def retrieve_batch(ws: str, body: BatchRetrieveRequest) -> dict:
        results = await engine.retrieval.retrieve_batch(ws, body.queries, top_k=body.top_k,
                                              min_similarity=body.min_similarity, exclude_ids=body.exclude_ids)
        return {"results": results}

    @app.post("/v1/workspaces/{ws}/feedback", tags=["experiences"])
    async def feedback(ws: str, body: FeedbackRequest) -> dict:
        items = [item.model_dump() for item in body.items]
        return await engine.feedback(ws, items, request_id=body.request_id,
                                     digest=body_digest({"items": items}))

    @app.post("/v1/workspaces/{ws}/prune", tags=["experiences"])
    async def prune(ws: str, body: PruneRequest) -> dict:
        return await engine.prune(ws, dry_run=body.dry_run, request_id=body.request_id, digest="prune")

    # ------------------------------------------------------------ CRUD, import, export

    @app.get("/v1/workspaces/{ws}/experiences", tags=["crud"])
    async def list_experiences(ws: str, status: Literal["active", "archived", "all"] = "all",
                               offset: int = Query(default=0, ge=0), limit: int = Query(default=100, ge=1, le=10_000)
                               ) -> dict:
        index = engine.store.index(ws)
        chosen = [e for e in index.experiences.values() if status == "all" or e.status == status]
        return {"total": len(chosen), "experiences": [e.model_dump(mode="json") for e in chosen[offset:offset + limit]]}

    @app.post("/v1/workspaces/{ws}/experiences", tags=["crud"])
    async def create_experience(ws: str, body: ExperienceCreate) -> dict:
        fields = body.model_dump(exclude={"request_id"})
        return await engine.create(ws, fields, request_id=body.request_id, digest=body_digest(fields))

    @app.get("/v1/workspaces/{ws}/experiences/{experience_id}", tags=["crud"])
    async def get_experience(ws: str, experience_id: str) -> dict:
        return engine.store.experience(ws, experience_id).model_dump(mode="json")

    @app.patch("/v1/workspaces/{ws}/experiences/{experience_id}", tags=["crud"])
    async def patch_experience(ws: str, experience_id: str, body: ExperiencePatch) -> dict:
        fields = body.model_dump(exclude={"request_id"}, exclude_none=True)
        if not fields:
            raise ServiceError(422, "empty_patch", "give at least one field to change")
        return await engine.patch(ws, experience_id, fields, request_id=body.request_id,
                                  digest=body_digest(body.model_dump(mode="json", exclude={"request_id"})))

    @app.delete("/v1/workspaces/{ws}/experiences/{experience_id}", tags=["crud"])
    async def delete_experience(ws: str, experience_id: str,
                                request_id: str | None = Query(default=None, pattern=REQUEST_ID_PATTERN)) -> dict:
        return await engine.delete(ws, experience_id, request_id=request_id)

    @app.post("/v1/workspaces/{ws}/import", tags=["crud"])
    async def import_experiences(ws: str, body: ImportRequest) -> dict:
        items = [item.model_dump(mode="json") for item in body.experiences]
        return await engine.import_experiences(ws, items, keep_usage=body.keep_usage, request_id=body.request_id,
                                               digest=body_digest({"items": items, "keep": body.keep_usage}))

    @app.post("/v1/workspaces/{ws}/export", tags=["crud"])
    async def export(ws: str, body: ExportRequest) -> dict:
        return await engine.export(ws, include_archived=body.include_archived, write_file=body.write_file)

    # ------------------------------------------------------------ ReMe-compatible

    @app.get("/health", tags=["reme"])
    async def reme_health() -> dict:
        return {"status": "healthy"}

    @app.post("/summary_task_memory", tags=["reme"])
    async def summary_task_memory(body: ReMeSummaryRequest) -> dict:
        check_limit(len(body.trajectories))
        views = [build_view(messages=[m.as_sent() for m in t.messages], reward=t.score, success_threshold=threshold,
                            trajectory_id=None, task_id=t.task_id, query=t.query) for t in body.trajectories]
        digest = body_digest(body.model_dump(mode="json"))
        result = await engine.ingest.summarize(body.workspace_id, views, mode=settings.summary.mode, request_id=None,
                                        digest=digest)
        memories = [reme_memory({**e, "author": e["provenance"]["author"]}) for e in result["experiences"]]
        return {"answer": json.dumps(memories, ensure_ascii=False), "messages": [], "success": True,
                "metadata": {"memory_list": memories,
                             "update_result": {"deleted_count": 0, "inserted_count": len(result["created"]),
                                               "updated_count": len(result["updated"])},
                             "mode_used": result["mode_used"], "errors": result["errors"]}}

    @app.post("/retrieve_task_memory", tags=["reme"])
    async def retrieve_task_memory(body: ReMeRetrieveRequest) -> dict:
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

    return app
