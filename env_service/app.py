"""The environment service app: the clean /v1 API plus the AgentEvolver-compatible routes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Query
from starlette.concurrency import run_in_threadpool

from common.schemas import Split
from common.service import ORJSONResponse, ServiceError, create_app
from env_service.backends import Backend, InlineBackend
from env_service.compat import add_compat_routes
from env_service.environments.base import SPLITS, Environment
from env_service.manager import InstanceManager
from env_service.protocol import (
    CreateRequest,
    CreateResponse,
    EnvironmentDescription,
    EnvironmentList,
    EnvironmentProfile,
    EvaluateRequest,
    EvaluateResponse,
    ForkRequest,
    ForkResponse,
    InstanceDescription,
    InstanceList,
    ReferenceEpisode,
    ReleaseResponse,
    StateResponse,
    StepRequest,
    StepResponse,
    TaskList,
    ToolList,
)
from env_service.registry import load_environments
from env_service.settings import EnvServiceSettings


def make_backend(settings: EnvServiceSettings, environments: dict[str, Environment]) -> Backend:
    if settings.backend == "ray":
        from env_service.ray_backend import RayBackend  # Ray is heavy: import only when asked for

        return RayBackend(settings.environments, settings.plugins, settings.ray)
    return InlineBackend(environments, settings.threads)


def build_app(settings: EnvServiceSettings, environments: dict[str, Environment] | None = None) -> FastAPI:
    """The service app. `environments` defaults to loading the enabled ones from the allowlist."""
    environments = environments if environments is not None else load_environments(
        settings.environments, settings.plugins)
    backend = make_backend(settings, environments)
    manager = InstanceManager(backend, environments, max_instances=settings.max_instances,
                              ttl_s=settings.instance_ttl_s, call_timeout_s=settings.call_timeout_s,
                              create_timeout_s=settings.create_timeout_s, retry_after_s=settings.retry_after_s)
    started = {"ok": False}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await backend.start()
        maintenance = asyncio.create_task(manager.maintenance_loop(settings.reap_interval_s))
        started["ok"] = True
        try:
            yield
        finally:
            started["ok"] = False
            maintenance.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await maintenance
            await manager.close()

    async def ready() -> bool | str:
        if not started["ok"]:
            return False
        for env in environments.values():
            reason = await run_in_threadpool(env.unready)
            if reason:
                return reason
        return True

    app = create_app("env_service", description="Gym-style environments over HTTP", ready=ready,
                     max_body_bytes=settings.max_body_bytes, lifespan=lifespan)
    app.state.manager = manager
    app.state.settings = settings
    add_v1_routes(app, manager)
    add_compat_routes(app, manager)
    return app


def _messages(messages: list) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in messages]


def add_v1_routes(app: FastAPI, manager: InstanceManager) -> None:
    # Hot routes return ORJSONResponse directly: FastAPI's generic response encoding costs more
    # than the rest of a step.

    @app.get("/v1/environments", tags=["environments"], response_model=EnvironmentList)
    async def list_environments() -> ORJSONResponse:
        out = []
        for name, env in manager.environments.items():
            splits = await run_in_threadpool(lambda e=env: {s: len(e.task_ids(s)) for s in SPLITS})
            out.append({"name": name, "splits": splits})
        return ORJSONResponse({"environments": out})

    @app.get("/v1/environments/{env}", tags=["environments"], response_model=EnvironmentDescription)
    async def describe_environment(env: str) -> ORJSONResponse:
        environment = manager.environment(env)
        task_ids = await run_in_threadpool(lambda: {s: environment.task_ids(s) for s in SPLITS})
        info = await run_in_threadpool(environment.info)
        return ORJSONResponse({"name": env, "info": info, "task_ids": task_ids})

    @app.get("/v1/environments/{env}/tasks", tags=["environments"], response_model=TaskList)
    async def list_tasks(env: str, split: Split = Query("train")) -> ORJSONResponse:
        environment = manager.environment(env)
        task_ids = await run_in_threadpool(environment.task_ids, split)
        return ORJSONResponse({"env": env, "split": split, "task_ids": task_ids})

    @app.get("/v1/environments/{env}/profile", tags=["environments"], response_model=EnvironmentProfile)
    async def profile(env: str) -> ORJSONResponse:
        return ORJSONResponse(await run_in_threadpool(manager.environment(env).profile))

    @app.get("/v1/environments/{env}/tools", tags=["environments"], response_model=ToolList)
    async def tool_docs(env: str, task_id: str | None = None) -> ORJSONResponse:
        environment = manager.environment(env)
        try:
            tools = await run_in_threadpool(environment.tool_docs, task_id)
        except KeyError:
            raise ServiceError(404, "unknown_task", f"environment {env!r} has no task {task_id!r}") from None
        return ORJSONResponse({"env": env, "task_id": task_id, "tools": tools})

    @app.get("/v1/environments/{env}/tasks/{task_id}/reference", tags=["environments"],
             response_model=ReferenceEpisode)
    async def reference_episode(env: str, task_id: str) -> ORJSONResponse:
        """A train task solved by its reference (`Environment.reference_episode`): the data of a warm start from
        the environment's own tasks. Held-out tasks' references are never served."""
        environment = manager.environment(env)
        if task_id not in await run_in_threadpool(environment.task_ids, "train"):
            held_out = [s for s in SPLITS if s != "train" and task_id in environment.task_ids(s)]
            if held_out:
                raise ServiceError(403, "held_out_task", f"task {task_id!r} is a {held_out[0]} task of {env!r}: "
                                   "only train tasks' references are served")
            raise ServiceError(404, "unknown_task", f"environment {env!r} has no task {task_id!r}")
        messages = await run_in_threadpool(environment.reference_episode, task_id)
        if messages is None:
            raise ServiceError(404, "no_reference", f"environment {env!r} publishes no reference solutions")
        return ORJSONResponse({"env": env, "task_id": task_id,
                               "messages": [m.model_dump(mode="json", exclude_none=True) for m in messages]})

    @app.get("/v1/instances", tags=["instances"], response_model=InstanceList)
    async def list_instances() -> ORJSONResponse:
        return ORJSONResponse({"stats": manager.stats(), "instances": manager.live()})

    @app.post("/v1/instances", tags=["instances"], status_code=201, response_model=CreateResponse)
    async def create_instance(body: CreateRequest) -> ORJSONResponse:
        record, messages = await manager.create(body.env, body.task_id, body.params, body.instance_id)
        return ORJSONResponse({"instance_id": record.instance_id, "env": record.env, "task_id": record.task_id,
                               "messages": _messages(messages), "host": manager.backend.where(record.instance_id)},
                              status_code=201)

    @app.get("/v1/instances/{instance_id}", tags=["instances"], response_model=InstanceDescription)
    async def describe_instance(instance_id: str) -> ORJSONResponse:
        description = manager.record(instance_id).describe(time.monotonic())
        return ORJSONResponse({**description, "host": manager.backend.where(instance_id)})

    @app.post("/v1/instances/{instance_id}/step", tags=["instances"], response_model=StepResponse)
    async def step(instance_id: str, body: StepRequest) -> ORJSONResponse:
        result = await manager.step(instance_id, body.action)
        return ORJSONResponse({"observation": result.observation.model_dump(exclude_none=True),
                               "reward": result.reward, "done": result.done, "info": result.info})

    @app.post("/v1/instances/{instance_id}/evaluate", tags=["instances"], response_model=EvaluateResponse)
    async def evaluate(instance_id: str, body: EvaluateRequest | None = None) -> ORJSONResponse:
        result = await manager.evaluate(instance_id, body.params if body else {})
        return ORJSONResponse({"score": result.score, "info": result.info})

    @app.get("/v1/instances/{instance_id}/state", tags=["instances"], response_model=StateResponse)
    async def state(instance_id: str) -> ORJSONResponse:
        snapshot = await manager.state(instance_id)
        return ORJSONResponse({"instance_id": instance_id, **snapshot})

    @app.post("/v1/instances/{instance_id}/fork", tags=["instances"], status_code=201, response_model=ForkResponse)
    async def fork(instance_id: str, body: ForkRequest | None = None) -> ORJSONResponse:
        """An independent copy of the instance in its current state, for environments whose capabilities declare
        `fork` (409 `fork_unsupported` for the others): stepping either one never moves the other."""
        record = await manager.fork(instance_id, body.instance_id if body else None)
        return ORJSONResponse({"instance_id": record.instance_id, "forked_from": instance_id, "env": record.env,
                               "task_id": record.task_id, "steps": record.steps}, status_code=201)

    @app.delete("/v1/instances/{instance_id}", tags=["instances"], response_model=ReleaseResponse)
    async def release(instance_id: str) -> ORJSONResponse:
        return ORJSONResponse({"instance_id": instance_id, "released": await manager.release(instance_id)})
