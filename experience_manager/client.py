"""Typed async client of the experience manager (what the trainer and the launcher import).

    async with ExperienceClient("http://127.0.0.1:8003") as em:
        got = await em.retrieve("my_ws", task.query)            # got.rendered, got.experience_ids
        await em.summarize("my_ws", trajectories)                 # after a training step
        await em.feedback("my_ws", [FeedbackItem(experience_ids=got.experience_ids, reward=1.0, baseline=0.4)])

Every mutation carries a request id (generated when not given), so the client retries it safely:
the service answers a repeated id with the first answer instead of applying it twice.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from common.http import ServiceClient
from common.schemas import Experience, Trajectory


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")


class RetrievedExperience(_Reply):
    experience_id: str
    when_to_use: str
    content: str
    kind: str
    similarity: float
    relevance: float
    score: float
    utility: float
    tags: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    demonstration: list[dict[str, Any]] | None = None  # the solved trajectory's chat turns, when kept
    task_kind: str | None = None  # the kind of task it was distilled from, when known


class RetrievalResult(_Reply):
    workspace_id: str
    query: str  # the task text that was embedded
    experiences: list[RetrievedExperience]
    experience_ids: list[str]
    rendered: str  # ReMe-style block; wrap it in the trainer's experience template
    pool_version: int
    cached: bool = False


class SummarizeResult(_Reply):
    workspace_id: str
    mode_used: str  # llm | heuristic | mixed | none
    created: list[str]
    updated: list[str]
    merged: list[dict[str, Any]]
    archived: list[str]
    errors: list[str]
    experiences: list[dict[str, Any]]
    idempotent_replay: bool = False


class FeedbackItem(BaseModel):
    experience_ids: list[str]
    reward: float
    success: bool | None = None
    baseline: float | None = None  # mean reward of the same task's rollouts without experience


class FeedbackResult(_Reply):
    workspace_id: str
    updated: int
    archived: list[dict[str, Any]]
    unknown_ids: list[str]
    usage: dict[str, dict[str, Any]]
    idempotent_replay: bool = False


def _request_id(given: str | None) -> str:
    return given or uuid.uuid4().hex


class ExperienceClient(ServiceClient):
    # ------------------------------------------------------------ retrieval

    async def retrieve(self, workspace_id: str, query: str | None = None, *, messages: list[dict] | None = None,
                       top_k: int | None = None, min_similarity: float | None = None,
                       exclude_ids: list[str] | None = None, task_kind: str | None = None) -> RetrievalResult:
        """Experiences for one task: pass the task text as `query` (or the initial `messages`); `task_kind`
        ranks experiences of the task's own kind first."""
        body: dict[str, Any] = {"exclude_ids": exclude_ids or []}
        if task_kind is not None:
            body["task_kind"] = task_kind
        if messages is not None:
            body["messages"] = messages
        else:
            body["query"] = query
        if top_k is not None:
            body["top_k"] = top_k
        if min_similarity is not None:
            body["min_similarity"] = min_similarity
        return await self.post(f"/v1/workspaces/{workspace_id}/retrieve", body, model=RetrievalResult,
                               idempotent=True)

    async def retrieve_batch(self, workspace_id: str, queries: list[str], *, top_k: int | None = None,
                             min_similarity: float | None = None) -> list[RetrievalResult]:
        body: dict[str, Any] = {"queries": queries}
        if top_k is not None:
            body["top_k"] = top_k
        if min_similarity is not None:
            body["min_similarity"] = min_similarity
        data = await self.post(f"/v1/workspaces/{workspace_id}/retrieve:batch", body, idempotent=True)
        return [RetrievalResult.model_validate(r) for r in data["results"]]

    # ------------------------------------------------------------ summarize, feedback, prune

    async def summarize(self, workspace_id: str, trajectories: list[Trajectory], *,
                        mode: Literal["auto", "llm", "heuristic"] | None = None,
                        request_id: str | None = None, timeout: float | None = None) -> SummarizeResult:
        body = {"trajectories": [t.model_dump(mode="json") for t in trajectories], "mode": mode,
                "request_id": _request_id(request_id)}
        return await self.post(f"/v1/workspaces/{workspace_id}/summarize", body, model=SummarizeResult,
                               idempotent=True, timeout=timeout)

    async def summarize_job(self, workspace_id: str, trajectories: list[Trajectory], *,
                            mode: Literal["auto", "llm", "heuristic"] | None = None,
                            request_id: str | None = None) -> str:
        """Start summarizing in the background; returns the job id for `job()` / `wait_job()`."""
        body = {"trajectories": [t.model_dump(mode="json") for t in trajectories], "mode": mode,
                "request_id": _request_id(request_id), "async": True}
        data = await self.post(f"/v1/workspaces/{workspace_id}/summarize", body, idempotent=True)
        return data["job_id"]

    async def job(self, job_id: str) -> dict[str, Any]:
        return await self.get(f"/v1/jobs/{job_id}")

    async def wait_job(self, job_id: str, *, poll: float = 0.5, timeout: float = 600) -> SummarizeResult:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            job = await self.job(job_id)
            if job["status"] == "done":
                return SummarizeResult.model_validate(job["result"])
            if job["status"] == "failed":
                raise RuntimeError(f"summarize job {job_id} failed: {job['error']}")
            if loop.time() > deadline:
                raise TimeoutError(f"summarize job {job_id} still running after {timeout}s: {job['progress']}")
            await asyncio.sleep(poll)

    async def feedback(self, workspace_id: str, items: list[FeedbackItem], *,
                       request_id: str | None = None) -> FeedbackResult:
        """Report rollouts that used experiences: their reward and, when known, the no-experience baseline."""
        body = {"items": [i.model_dump() for i in items], "request_id": _request_id(request_id)}
        return await self.post(f"/v1/workspaces/{workspace_id}/feedback", body, model=FeedbackResult,
                               idempotent=True)

    async def prune(self, workspace_id: str, *, dry_run: bool = False, request_id: str | None = None) -> dict:
        return await self.post(f"/v1/workspaces/{workspace_id}/prune",
                               {"dry_run": dry_run, "request_id": _request_id(request_id)}, idempotent=True)

    # ------------------------------------------------------------ CRUD, import/export, workspaces

    async def create_experience(self, workspace_id: str, when_to_use: str, content: str, *,
                                request_id: str | None = None, **fields: Any) -> Experience:
        body = {"when_to_use": when_to_use, "content": content, "request_id": _request_id(request_id), **fields}
        data = await self.post(f"/v1/workspaces/{workspace_id}/experiences", body, idempotent=True)
        return Experience.model_validate(data["experience"])

    async def get_experience(self, workspace_id: str, experience_id: str) -> Experience:
        return await self.get(f"/v1/workspaces/{workspace_id}/experiences/{experience_id}", model=Experience)

    async def list_experiences(self, workspace_id: str, *, status: str = "all", offset: int = 0,
                               limit: int = 100) -> list[Experience]:
        data = await self.get(f"/v1/workspaces/{workspace_id}/experiences",
                              params={"status": status, "offset": offset, "limit": limit})
        return [Experience.model_validate(e) for e in data["experiences"]]

    async def update_experience(self, workspace_id: str, experience_id: str, *, request_id: str | None = None,
                                **fields: Any) -> Experience:
        data = await self.request("PATCH", f"/v1/workspaces/{workspace_id}/experiences/{experience_id}",
                                  json={**fields, "request_id": _request_id(request_id)}, idempotent=True)
        return Experience.model_validate(data["experience"])

    async def delete_experience(self, workspace_id: str, experience_id: str) -> dict:
        return await self.delete(f"/v1/workspaces/{workspace_id}/experiences/{experience_id}")

    async def export(self, workspace_id: str, *, include_archived: bool = True, write_file: bool = False) -> dict:
        return await self.post(f"/v1/workspaces/{workspace_id}/export",
                               {"include_archived": include_archived, "write_file": write_file}, idempotent=True)

    async def import_experiences(self, workspace_id: str, experiences: list[dict[str, Any]], *,
                                 keep_usage: bool = True, request_id: str | None = None) -> dict:
        body = {"experiences": experiences, "keep_usage": keep_usage, "request_id": _request_id(request_id)}
        return await self.post(f"/v1/workspaces/{workspace_id}/import", body, idempotent=True)

    async def stats(self, workspace_id: str) -> dict:
        return await self.get(f"/v1/workspaces/{workspace_id}/stats")

    async def list_workspaces(self) -> list[dict]:
        return (await self.get("/v1/workspaces"))["workspaces"]

    async def create_workspace(self, workspace_id: str) -> dict:
        return await self.request("PUT", f"/v1/workspaces/{workspace_id}")

    async def delete_workspace(self, workspace_id: str) -> dict:
        return await self.delete(f"/v1/workspaces/{workspace_id}")
