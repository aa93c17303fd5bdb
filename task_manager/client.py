"""`TaskClient`: the typed async client of the task manager (what the trainer and launcher use).

    async with TaskClient("http://127.0.0.1:8030") as tasks:
        batch = await tasks.sample_batch(32, seed=step)          # list of common.schemas.Task
        reward = await tasks.grade(task.task_id, state=snapshot)  # synthetic tasks: state match
        await tasks.feedback({task.task_id: [1.0, 0.0, 1.0]})    # recent outcomes -> curriculum
        job = await tasks.submit_job("flights", episodes=50)      # explore + synthesize
        job = await tasks.wait_job(job.job_id)

A task never comes with its reference solution; an original task (`synthetic=False`) is graded by
the environment's own evaluate, a synthetic one by `grade`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from common.http import ServiceClient
from common.schemas import Task, Trajectory
from task_manager.protocol import (
    ArgumentValuesResponse,
    BatchResponse,
    GradeResponse,
    JobInfo,
    ReferenceResponse,
    SeedResponse,
    TaskDetail,
    TaskPage,
    TrainingReferencesResponse,
)


class TaskClient(ServiceClient):
    async def sample_batch(self, batch_size: int, *, env: str | None = None, synthetic_ratio: float | None = None,
                           seed: int | None = None) -> list[Task]:
        return (await self.sample_batch_detail(batch_size, env=env, synthetic_ratio=synthetic_ratio, seed=seed)).tasks

    async def sample_batch_detail(self, batch_size: int, *, env: str | None = None,
                                  synthetic_ratio: float | None = None, seed: int | None = None) -> BatchResponse:
        body: dict[str, Any] = {"batch_size": batch_size, "env": env, "synthetic_ratio": synthetic_ratio, "seed": seed}
        # Sampling changes nothing on the server: safe to retry.
        return await self.post("/v1/batches", json=body, model=BatchResponse, idempotent=True)

    async def grade(self, task_id: str, *, state: Any = None, trajectory: Trajectory | None = None) -> float:
        return (await self.grade_detail(task_id, state=state, trajectory=trajectory)).reward

    async def grade_detail(self, task_id: str, *, state: Any = None,
                           trajectory: Trajectory | None = None) -> GradeResponse:
        body: dict[str, Any] = {"task_id": task_id, "state": state,
                                "trajectory": trajectory.model_dump(mode="json") if trajectory else None}
        return await self.post("/v1/grade", json=body, model=GradeResponse, idempotent=True)

    async def feedback(self, outcomes: dict[str, list[float]], env_type: str | None = None,
                       request_id: str | None = None) -> int:
        """Report recent rollout rewards per task id; returns how many tasks were updated. With a
        `request_id` the report is applied once however often it is sent, so it is retried like a GET."""
        results = [{"task_id": t, "env_type": env_type, "outcomes": list(v)} for t, v in outcomes.items()]
        body: dict[str, Any] = {"results": results, "request_id": request_id}
        return (await self.post("/v1/feedback", json=body, idempotent=request_id is not None))["updated"]

    async def list_tasks(self, *, env: str | None = None, synthetic: bool | None = None, limit: int = 100,
                         offset: int = 0) -> TaskPage:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if env is not None:
            params["env"] = env
        if synthetic is not None:
            params["synthetic"] = str(synthetic).lower()
        return await self.get("/v1/tasks", params=params, model=TaskPage)

    async def get_task(self, task_id: str, env: str | None = None) -> TaskDetail:
        return await self.get(f"/v1/tasks/{task_id}", params={"env": env} if env else None, model=TaskDetail)

    async def submit_job(self, env: str, episodes: int = 20, *, kind: str = "synthesize", **options: Any) -> JobInfo:
        body = {"env": env, "episodes": episodes, "kind": kind, **options}
        return await self.post("/v1/jobs", json=body, model=JobInfo)

    async def job(self, job_id: str) -> JobInfo:
        return await self.get(f"/v1/jobs/{job_id}", model=JobInfo)

    async def jobs(self) -> list[JobInfo]:
        return [JobInfo.model_validate(j) for j in (await self.get("/v1/jobs"))["jobs"]]

    async def cancel_job(self, job_id: str) -> JobInfo:
        return await self.post(f"/v1/jobs/{job_id}/cancel", model=JobInfo, idempotent=True)

    async def wait_job(self, job_id: str, timeout: float = 600.0, poll: float = 0.5) -> JobInfo:
        deadline = time.monotonic() + timeout
        while True:
            job = await self.job(job_id)
            if job.status in ("done", "failed", "cancelled"):
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job.status} after {timeout}s: {job.progress}")
            await asyncio.sleep(poll)

    async def seed_experience(self, env: str, workspace: str = "default", *, task_ids: list[str] | None = None,
                              limit: int = 64, request_id: str | None = None,
                              timeout: float | None = 900.0) -> SeedResponse:
        """Seed `workspace` of the task manager's experience manager from verified synthetic tasks.
        Retried only with a `request_id` (the experience manager applies a repeated one once)."""
        body = {"env": env, "workspace": workspace, "task_ids": task_ids, "limit": limit, "request_id": request_id}
        return await self.post("/v1/seed_experience", json=body, model=SeedResponse,
                               idempotent=request_id is not None, timeout=timeout)

    async def reference(self, task_id: str) -> ReferenceResponse:
        """A synthetic task's verified reference. For the judge only (it returns labels, never this)."""
        return await self.get(f"/v1/references/{task_id}", model=ReferenceResponse)

    async def training_references(self, env: str, *, limit: int = 10_000,
                                  timeout: float | None = 900.0) -> TrainingReferencesResponse:
        """The trainable synthetic tasks solved by their replayed references (the warm start's data; the task
        manager serves them only with `serve_training_references: true`)."""
        return await self.post("/v1/training_references", json={"env": env, "limit": limit},
                               model=TrainingReferencesResponse, idempotent=True, timeout=timeout)

    async def argument_values(self, env: str, seed_task_id: str) -> ArgumentValuesResponse:
        """Per tool and argument, the values an episode of `seed_task_id` knows at its start (what a forced
        exploration call may take)."""
        return await self.post("/v1/argument_values", json={"env": env, "seed_task_id": seed_task_id},
                               model=ArgumentValuesResponse, idempotent=True)

    async def stats(self) -> dict[str, Any]:
        return await self.get("/v1/stats")
