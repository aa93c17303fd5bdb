"""The experience manager's app: the `/v1/workspaces/{ws}/...` API (`routes`) and the ReMe-compatible
task-memory routes (`reme`) around one engine."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from common.service import add_error_renderer, create_app
from experience_manager import reme, routes
from experience_manager.engine import ExperienceEngine
from experience_manager.protocol import ReMeError
from experience_manager.settings import ExperienceManagerSettings


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
    add_error_renderer(app, reme.reme_error, reme.REME_PATHS, ReMeError)
    for router in (routes.workspaces, routes.experiences, routes.crud, reme.router):
        app.include_router(router)
    return app
