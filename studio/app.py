"""The studio's FastAPI app: server-rendered pages over run folders and, while live, the services.

| page | what |
|---|---|
| `/` | every run: status (live, finished, crashed), start, config, headline metrics |
| `/runs/{run}` | curves, mechanism counters, before/after table, config and manifest; polls while live |
| `/runs/{run}/rollouts` | the recorded rollouts, by step, with outcome and experience flag |
| `/runs/{run}/rollouts/{id}` | one rollout turn by turn: tokens by loss mask, labels, advantages, its group |
| `/runs/{run}/tasks` | original and synthetic tasks, the synthesis funnel, curriculum pass rates |
| `/runs/{run}/experiences` | the pool, who used what, and a search through the experience manager |
| `/runs/{run}/logs/{name}` | the tail of a service's log |

Errors are HTML pages with a status (404 unknown run, rollout, page or `../`; 400 a malformed page
number), never a traceback. With EVOLVER_API_TOKEN set, `/login` takes the token once and sets a
cookie, since a browser following links sends no bearer header.
"""

from __future__ import annotations

import hmac
import os
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from loguru import logger
from starlette.exceptions import HTTPException

from common.service import create_app
from studio import login, pages
from studio.context import HERE, Studio
from studio.login import COOKIE
from studio.runs import StudioError
from studio.settings import StudioSettings

OPEN_PREFIXES = ("/login", "/healthz", "/static/", "/metrics")


def build_app(settings: StudioSettings, token: str | None = None) -> FastAPI:
    token = token if token is not None else (os.environ.get("EVOLVER_API_TOKEN") or None)
    studio = Studio(settings, token)
    # The services' bearer guard stays off (token=""): pages authenticate by cookie, below.
    app = create_app("studio", description="The web view of evolver runs", token="")
    app.state.studio = studio
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    _error_pages(app, studio)

    @app.middleware("http")
    async def _cookie_auth(request: Request, call_next: Any) -> Response:
        if not token or request.url.path.startswith(OPEN_PREFIXES):
            return await call_next(request)
        if hmac.compare_digest(request.cookies.get(COOKIE, ""), token):
            return await call_next(request)
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)

    app.include_router(login.router)
    app.include_router(pages.router)
    return app


def _error_pages(app: FastAPI, studio: Studio) -> None:
    """Every error is an HTML page with its status, never a traceback."""

    @app.exception_handler(StudioError)
    async def _studio_error(request: Request, exc: StudioError) -> Response:
        return studio.error_page(exc.status, exc.title, exc.message)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 404:
            return studio.error_page(404, "page not found", f"there is no page at {request.url.path[:200]}")
        return studio.error_page(exc.status_code, "request refused", str(exc.detail)[:300])

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        return studio.error_page(400, "bad request", problems)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        logger.exception("studio: error while serving {}", request.url.path)
        return studio.error_page(500, "studio error", f"the studio could not render {request.url.path[:200]}; "
                                                      f"its log has the details")
