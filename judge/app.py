"""HTTP routes of the judge service on the shared service base."""

from __future__ import annotations

import math
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request

from common.llm import LLMClient
from common.service import ServiceError, create_app
from judge.core import Judge
from judge.references import ReferenceSource
from judge.schemas import JudgeRequest, JudgeResponse, JudgeStats
from judge.settings import JudgeSettings


def _problems(request: JudgeRequest) -> list[dict]:
    problems = []
    for i, traj in enumerate(request.trajectories):
        where = f"trajectories[{i}] (id {traj.trajectory_id!r})"
        if not traj.steps:
            problems.append({"index": i, "trajectory_id": traj.trajectory_id, "field": "steps",
                             "message": f"{where} has no steps; send only trajectories with at least one step"})
        if not math.isfinite(traj.outcome):
            problems.append({"index": i, "trajectory_id": traj.trajectory_id, "field": "outcome",
                             "message": f"{where} has a non-finite outcome ({traj.outcome}); "
                                        "grade the trajectory to a finite reward first"})
    return problems


def create_judge_app(settings: JudgeSettings) -> FastAPI:
    if settings.llm is None and settings.labeller != "reference_rule":
        raise ValueError("judge.llm is not set: configure the judge LLM role (base_url, model) in the `judge` "
                         "section of --conf, or pass --llm-base-url and --llm-model")
    llm = LLMClient("judge", settings.llm) if settings.llm is not None else None
    references = ReferenceSource(settings.task_manager_url, cache_size=settings.cache_size or 1) \
        if settings.uses_references and settings.task_manager_url else None

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await app.state.judge.aclose()

    app = create_app("judge", description="Labels every step of a trajectory GOOD or BAD: an LLM judge, or a rule "
                     "against a synthetic task's verified reference fetched from the task manager.",
                     max_body_bytes=settings.max_body_bytes, lifespan=lifespan)
    # The judge's counters live on the service registry, so /metrics serves them.
    judge = app.state.judge = Judge(settings, llm, app.state.metrics_registry, references)

    @app.post("/v1/judge", response_model=JudgeResponse, tags=["judge"])
    async def judge_route(body: JudgeRequest, request: Request) -> JudgeResponse:
        """One GOOD/BAD label (with a short reason) per step of every trajectory, in request order."""
        if not body.trajectories:
            raise ServiceError(422, "empty_batch", "trajectories is empty; send at least one trajectory")
        if len(body.trajectories) > settings.max_batch:
            raise ServiceError(422, "batch_too_large", f"{len(body.trajectories)} trajectories exceed the limit of "
                                                       f"{settings.max_batch} per request; split the batch")
        problems = _problems(body)
        if problems:
            summary = "; ".join(p["message"] for p in problems[:5])
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise ServiceError(422, "invalid_trajectories", summary + more, problems)
        request_id = getattr(request.state, "request_id", "-")
        return await judge.judge_batch(body.trajectories, request_id)

    @app.get("/v1/stats", response_model=JudgeStats, tags=["judge"])
    async def stats_route() -> JudgeStats:
        """Label rates on successful vs failed trajectories, fallback and raw parse rates, usage since start."""
        return judge.stats()

    return app
