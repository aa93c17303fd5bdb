"""The task manager's HTTP API (/v1) over `TaskManager`.

| route | what |
|---|---|
| `POST /v1/jobs` | start an explore or synthesize job (202, returns the job with its progress) |
| `GET /v1/jobs`, `GET /v1/jobs/{id}`, `POST /v1/jobs/{id}/cancel` | jobs and their progress |
| `GET /v1/tasks?env=&synthetic=&limit=&offset=` | tasks as `common.schemas.Task` (never a reference) |
| `GET /v1/tasks/{id}?env=` | one task and its recent pass rate |
| `POST /v1/batches` | a training batch: original + synthetic by ratio, curriculum-weighted |
| `POST /v1/grade` | reward in [0, 1] of a synthetic task from a final state (or a trajectory: LLM judge) |
| `POST /v1/feedback` | recent rollout outcomes per task (curriculum) |
| `POST /v1/seed_experience` | seed an experience pool from verified synthetic tasks (never held-out ones) |
| `GET /v1/references/{id}` | a synthetic task's verified reference: for the judge only, never the trainer |
| `POST /v1/training_references` | trainable synthetic tasks solved by their references, one of each kind in turn where `limit` cuts them (the trainer's warm start; only with `serve_training_references`) |
| `GET /v1/stats` | counts, funnel, pass-rate summary |
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query

from common.service import create_app, from_app_state
from task_manager.protocol import (
    ArgumentValuesRequest,
    ArgumentValuesResponse,
    BatchRequest,
    BatchResponse,
    FeedbackRequest,
    FeedbackResponse,
    GradeRequest,
    GradeResponse,
    JobInfo,
    JobList,
    JobRequest,
    ReferenceResponse,
    SeedRequest,
    SeedResponse,
    TaskDetail,
    TaskPage,
    TrainingReferencesRequest,
    TrainingReferencesResponse,
)
from task_manager.service import TaskManager
from task_manager.settings import TaskManagerSettings

Manager = Annotated[TaskManager, Depends(from_app_state("manager"))]


def build_app(settings: TaskManagerSettings, env_client: Any | None = None) -> FastAPI:
    if env_client is None:
        from env_service.client import EnvClient

        env_client = EnvClient(settings.env_url, timeout=60.0)
    manager = TaskManager(settings, env_client)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        starter = asyncio.create_task(manager.start())
        try:
            yield
        finally:
            starter.cancel()
            await manager.close()
            await env_client.aclose()

    app = create_app("task_manager", description="Self-questioning: explore, synthesize verified tasks, grade, "
                     "curriculum", ready=lambda: manager.ready, max_body_bytes=settings.max_body_bytes,
                     lifespan=lifespan)
    app.state.manager = manager
    for router in (jobs, tasks, training, judge, service):
        app.include_router(router)
    return app


jobs = APIRouter(tags=["jobs"])


@jobs.post("/v1/jobs", status_code=202, response_model=JobInfo)
async def submit_job(body: JobRequest, manager: Manager) -> Any:
    return manager.submit(body)


@jobs.get("/v1/jobs", response_model=JobList)
async def list_jobs(manager: Manager) -> Any:
    return {"jobs": manager.store.jobs()}


@jobs.get("/v1/jobs/{job_id}", response_model=JobInfo)
async def get_job(job_id: str, manager: Manager) -> Any:
    return manager.job(job_id)


@jobs.post("/v1/jobs/{job_id}/cancel", response_model=JobInfo)
async def cancel_job(job_id: str, manager: Manager) -> Any:
    return manager.cancel(job_id)


tasks = APIRouter(tags=["tasks"])


@tasks.get("/v1/tasks", response_model=TaskPage)
async def list_tasks(manager: Manager, env: str | None = None, synthetic: bool | None = None,
                     limit: int = Query(100, ge=1, le=10_000), offset: int = Query(0, ge=0)) -> Any:
    found = manager.all_tasks(env, synthetic)
    return {"tasks": found[offset: offset + limit], "total": len(found)}


@tasks.get("/v1/tasks/{task_id}", response_model=TaskDetail)
async def get_task(task_id: str, manager: Manager, env: str | None = None) -> Any:
    task, rate = manager.get_task(task_id, env)
    return {"task": task, "pass_rate": rate[0] if rate else None, "rollouts": rate[1] if rate else 0}


training = APIRouter(tags=["training"])


@training.post("/v1/batches", response_model=BatchResponse)
async def sample_batch(body: BatchRequest, manager: Manager) -> Any:
    return manager.sample(body)


@training.post("/v1/grade", response_model=GradeResponse)
async def grade(body: GradeRequest, manager: Manager) -> Any:
    result = await manager.grade(body)
    return {"task_id": body.task_id, "reward": result.reward, "method": result.method}


@training.post("/v1/feedback", response_model=FeedbackResponse)
async def feedback(body: FeedbackRequest, manager: Manager) -> Any:
    updated, replay = manager.feedback(body)
    return {"updated": updated, "idempotent_replay": replay}


@training.post("/v1/seed_experience", response_model=SeedResponse)
async def seed_experience(body: SeedRequest, manager: Manager) -> Any:
    return await manager.seed_experience(body)


@training.post("/v1/training_references", response_model=TrainingReferencesResponse)
async def training_references(body: TrainingReferencesRequest, manager: Manager) -> Any:
    return await manager.training_references(body)


@training.post("/v1/argument_values", response_model=ArgumentValuesResponse)
async def argument_values(body: ArgumentValuesRequest, manager: Manager) -> Any:
    return await manager.argument_values(body)


judge = APIRouter(tags=["judge"])


@judge.get("/v1/references/{task_id}", response_model=ReferenceResponse)
async def get_reference(task_id: str, manager: Manager) -> Any:
    """The verified reference of a synthetic task, for reference-guided attribution: only the judge calls
    this, and it sends back labels, never the reference; the trainer must not."""
    return manager.reference(task_id)


service = APIRouter(tags=["service"])


@service.get("/v1/stats")
async def stats(manager: Manager) -> Any:
    return manager.stats()
