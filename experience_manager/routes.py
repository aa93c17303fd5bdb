"""The `/v1` routes, one router per group: workspaces, the experience loop (summarize, retrieve, feedback,
prune) and CRUD with import/export. Each route validates its body and hands it to the engine's part
that does the work.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query

from common.service import ServiceError, from_app_state
from experience_manager.durable import body_digest
from experience_manager.engine import ExperienceEngine
from experience_manager.protocol import (
    BatchRetrieveRequest,
    ExperienceCreate,
    ExperiencePatch,
    ExportRequest,
    FeedbackRequest,
    ImportRequest,
    PruneRequest,
    RetrieveRequest,
    SummarizeRequest,
)
from experience_manager.text import REQUEST_ID_PATTERN
from experience_manager.trajectories import view_of_trajectory

Engine = Annotated[ExperienceEngine, Depends(from_app_state("engine"))]
RequestIdParam = Annotated[str | None, Query(pattern=REQUEST_ID_PATTERN)]


def check_trajectory_count(engine: ExperienceEngine, n: int) -> None:
    limit = engine.settings.summary.max_trajectories
    if n > limit:
        raise ServiceError(422, "too_many_trajectories", f"{n} trajectories in one request; the limit is "
                                                         f"summary.max_trajectories={limit}")


workspaces = APIRouter(tags=["workspaces"])


@workspaces.get("/v1/workspaces")
async def list_workspaces(engine: Engine) -> dict:
    return {"workspaces": engine.list_workspaces()}


@workspaces.put("/v1/workspaces/{ws}")
async def create_workspace(ws: str, engine: Engine) -> dict:
    return await engine.create_workspace(ws)


@workspaces.delete("/v1/workspaces/{ws}")
async def delete_workspace(ws: str, engine: Engine, request_id: RequestIdParam = None) -> dict:
    return await engine.drop_workspace(ws, request_id=request_id)


@workspaces.get("/v1/workspaces/{ws}/stats")
async def stats(ws: str, engine: Engine) -> dict:
    return engine.workspace_stats(ws)


experiences = APIRouter(tags=["experiences"])


@experiences.post("/v1/workspaces/{ws}/summarize")
async def summarize(ws: str, body: SummarizeRequest, engine: Engine) -> dict:
    check_trajectory_count(engine, len(body.trajectories))
    summary = engine.settings.summary
    views = [view_of_trajectory(t, summary.success_threshold) for t in body.trajectories]
    mode = body.mode or summary.mode
    # Only what the client sent: server-side defaults (fresh trajectory ids) must not change the digest.
    digest = body_digest(body.model_dump(mode="json", exclude={"request_id", "run_async"}, exclude_unset=True))
    if body.run_async:
        return engine.ingest.start_summarize_job(ws, views, mode=mode, request_id=body.request_id, digest=digest)
    return await engine.ingest.summarize(ws, views, mode=mode, request_id=body.request_id, digest=digest)


@experiences.get("/v1/jobs/{job_id}")
async def job(job_id: str, engine: Engine) -> dict:
    return engine.ingest.job(job_id)


@experiences.post("/v1/workspaces/{ws}/retrieve")
async def retrieve(ws: str, body: RetrieveRequest, engine: Engine) -> dict:
    query = body.query if body.query is not None else json.dumps(body.messages)
    return await engine.retrieval.retrieve(ws, query, top_k=body.top_k, min_similarity=body.min_similarity,
                                           exclude_ids=body.exclude_ids, task_kind=body.task_kind)


@experiences.post("/v1/workspaces/{ws}/retrieve:batch")
async def retrieve_batch(ws: str, body: BatchRetrieveRequest, engine: Engine) -> dict:
    results = await engine.retrieval.retrieve_batch(ws, body.queries, top_k=body.top_k,
                                                    min_similarity=body.min_similarity, exclude_ids=body.exclude_ids)
    return {"results": results}


@experiences.post("/v1/workspaces/{ws}/feedback")
async def feedback(ws: str, body: FeedbackRequest, engine: Engine) -> dict:
    items = [item.model_dump() for item in body.items]
    return await engine.feedback(ws, items, request_id=body.request_id, digest=body_digest({"items": items}))


@experiences.post("/v1/workspaces/{ws}/prune")
async def prune(ws: str, body: PruneRequest, engine: Engine) -> dict:
    return await engine.prune(ws, dry_run=body.dry_run, request_id=body.request_id, digest="prune")


crud = APIRouter(tags=["crud"])


@crud.get("/v1/workspaces/{ws}/experiences")
async def list_experiences(ws: str, engine: Engine, status: Literal["active", "archived", "all"] = "all",
                           offset: int = Query(default=0, ge=0), limit: int = Query(default=100, ge=1, le=10_000)
                           ) -> dict:
    index = engine.store.index(ws)
    chosen = [e for e in index.experiences.values() if status == "all" or e.status == status]
    return {"total": len(chosen), "experiences": [e.model_dump(mode="json") for e in chosen[offset:offset + limit]]}


@crud.post("/v1/workspaces/{ws}/experiences")
async def create_experience(ws: str, body: ExperienceCreate, engine: Engine) -> dict:
    fields = body.model_dump(exclude={"request_id"})
    return await engine.create(ws, fields, request_id=body.request_id, digest=body_digest(fields))


@crud.get("/v1/workspaces/{ws}/experiences/{experience_id}")
async def get_experience(ws: str, experience_id: str, engine: Engine) -> dict:
    return engine.store.experience(ws, experience_id).model_dump(mode="json")


@crud.patch("/v1/workspaces/{ws}/experiences/{experience_id}")
async def patch_experience(ws: str, experience_id: str, body: ExperiencePatch, engine: Engine) -> dict:
    fields = body.model_dump(exclude={"request_id"}, exclude_none=True)
    if not fields:
        raise ServiceError(422, "empty_patch", "give at least one field to change")
    return await engine.patch(ws, experience_id, fields, request_id=body.request_id,
                              digest=body_digest(body.model_dump(mode="json", exclude={"request_id"})))


@crud.delete("/v1/workspaces/{ws}/experiences/{experience_id}")
async def delete_experience(ws: str, experience_id: str, engine: Engine,
                            request_id: RequestIdParam = None) -> dict:
    return await engine.delete(ws, experience_id, request_id=request_id)


@crud.post("/v1/workspaces/{ws}/import")
async def import_experiences(ws: str, body: ImportRequest, engine: Engine) -> dict:
    items = [item.model_dump(mode="json") for item in body.experiences]
    return await engine.import_experiences(ws, items, keep_usage=body.keep_usage, request_id=body.request_id,
                                           digest=body_digest({"items": items, "keep": body.keep_usage}))


@crud.post("/v1/workspaces/{ws}/export")
async def export(ws: str, body: ExportRequest, engine: Engine) -> dict:
    return await engine.export(ws, include_archived=body.include_archived, write_file=body.write_file)
