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
import json
import math
import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape
from loguru import logger
from starlette.exceptions import HTTPException

from common.service import create_app
from studio.charts import line_chart, series_from
from studio.rollouts import Rollouts, pass_rates_by_step, token_spans, turns
from studio.runs import JsonLines, Run, RunsRoot, StudioError, log_tail
from studio.settings import StudioSettings
from studio.sources import load_pool, load_tasks, search_pool

HERE = Path(__file__).resolve().parent
COOKIE = "evolver_studio_token"
OPEN_PREFIXES = ("/login", "/healthz", "/static/", "/metrics")
COUNTER_PREFIXES = ("experience/", "tasks/", "judge/", "rollout/dropped_groups", "rollout/groups",
                    "rollout/env_error_rate")


def paginate(raw: str | None, total: int, size: int) -> tuple[int, int, int]:
    """(page, pages, offset) for `?page=`: 400 when it is not a positive integer, 404 past the end."""
    pages = max(1, math.ceil(total / size))
    if raw is None or raw == "":
        return 1, pages, 0
    if not raw.isdigit() or len(raw) > 12 or int(raw) < 1:
        raise StudioError(400, "bad page number", f"page must be a whole number from 1 to {pages}, got {raw[:40]!r}")
    page = int(raw)
    if page > pages:
        raise StudioError(404, "page not found", f"page {page} does not exist: this list has {pages} page(s)")
    return page, pages, (page - 1) * size


def curve_keys(records: list[dict[str, Any]]) -> dict[str, list[str]]:
    evals = sorted({k for r in records for k in r if k.startswith("eval/") and ("avg@" in k or "best@" in k)})
    return {"reward": ["rollout/reward_mean", "rollout/success_rate"],
            "policy loss": ["update/pg_loss"],
            "clip fraction, flagged vs unflagged": ["update/clip_frac_flagged", "update/clip_frac_unflagged"],
            "held-out avg@k / best@k": evals,
            "experience share and hit rate": ["rollout/experience_frac", "experience/hit_rate"],
            "KL to the reference (k3)": ["update/kl"],
            "collapse detectors (rollouts without experience)": [
                "collapse/empty_reply_share", "collapse/invalid_action_rate", "collapse/reply_length_ratio"],
            # the policy's malformed actions apart from steps the environment itself failed
            "invalid actions vs environment errors": ["rollout/invalid_action_rate", "rollout/env_error_rate"]}


def build_app(settings: StudioSettings, token: str | None = None) -> FastAPI:
    token = token if token is not None else (os.environ.get("EVOLVER_API_TOKEN") or None)
    root = RunsRoot(settings.runs)
    lines = JsonLines()
    rollouts = Rollouts(lines)
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html", "jinja"]),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["pretty"] = lambda v: json.dumps(v, indent=2, default=str)
    env.filters["num"] = lambda v: "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
    env.filters["q"] = lambda v: quote(str(v), safe="")

    # The services' bearer guard stays off (token=""): pages authenticate by cookie, below.
    app = create_app("studio", description="The web view of evolver runs", token="")
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    def page(template: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = env.get_template(template).render(refresh_s=settings.refresh_s, **context)
        return HTMLResponse(html, status_code=status)

    def error_page(status: int, title: str, message: str) -> HTMLResponse:
        return page("error.jinja", status=status, title=title, message=message, code=status)

    @app.exception_handler(StudioError)
    async def _studio_error(request: Request, exc: StudioError) -> Response:
        return error_page(exc.status, exc.title, exc.message)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 404:
            return error_page(404, "page not found", f"there is no page at {request.url.path[:200]}")
        return error_page(exc.status_code, "request refused", str(exc.detail)[:300])

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        return error_page(400, "bad request", problems)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        logger.exception("studio: error while serving {}", request.url.path)
        return error_page(500, "studio error", f"the studio could not render {request.url.path[:200]}; "
                                               f"its log has the details")

    @app.middleware("http")
    async def _cookie_auth(request: Request, call_next: Any) -> Response:
        if not token or request.url.path.startswith(OPEN_PREFIXES):
            return await call_next(request)
        if hmac.compare_digest(request.cookies.get(COOKIE, ""), token):
            return await call_next(request)
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)

    @app.get("/login", response_class=HTMLResponse)
    async def login_form(next: str = "/") -> Response:
        return page("login.jinja", next=_safe_next(next), error=None, needed=bool(token))

    @app.post("/login", response_class=HTMLResponse)
    async def login(request: Request) -> Response:
        form = parse_qs((await request.body()).decode(errors="replace")[:10_000])
        given = (form.get("token") or [""])[0]
        target = _safe_next((form.get("next") or ["/"])[0])
        if not token:
            return RedirectResponse(target, status_code=303)
        if not hmac.compare_digest(given, token):
            return page("login.jinja", status=401, next=target, error="that token is not the services' token",
                        needed=True)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
        return response

    @app.get("/", response_class=HTMLResponse)
    async def runs_page(request: Request) -> Response:
        runs = root.runs()
        number, pages, offset = paginate(request.query_params.get("page"), len(runs), settings.page_size)
        rows = [_run_row(run, lines) for run in runs[offset:offset + settings.page_size]]
        return page("runs.jinja", rows=rows, root=str(root.root), page=number, pages=pages)

    @app.get("/runs/{name}", response_class=HTMLResponse)
    async def run_page(name: str) -> Response:
        run = root.run(name)
        return page("run.jinja", run=run, live=_live_context(run, lines), logs=_logs(run),
                    manifest=_manifest_view(run), config_text=run.config_text,
                    rollouts=len(rollouts.index(run)),
                    tensorboard=run.trainer_dir / "tensorboard" if (run.trainer_dir / "tensorboard").is_dir() else None)

    @app.get("/runs/{name}/live", response_class=HTMLResponse)
    async def run_live(name: str) -> Response:
        run = root.run(name)
        return page("live.jinja", run=run, live=_live_context(run, lines))

    @app.get("/runs/{name}/rollouts", response_class=HTMLResponse)
    async def rollouts_page(name: str, request: Request) -> Response:
        run = root.run(name)
        index = list(reversed(rollouts.index(run)))
        number, pages, offset = paginate(request.query_params.get("page"), len(index), settings.page_size)
        return page("rollouts.jinja", run=run, rows=index[offset:offset + settings.page_size], total=len(index),
                    page=number, pages=pages)

    @app.get("/runs/{name}/rollouts/{trajectory_id}", response_class=HTMLResponse)
    async def trajectory_page(name: str, trajectory_id: str) -> Response:
        run = root.run(name)
        entry = rollouts.entry(run, trajectory_id)
        record = rollouts.record(run, trajectory_id)
        injected = []
        if record["experience_ids"]:
            pool = await load_pool(run, lines)
            known = {e.experience_id: e for e in pool.experiences}
            injected = [(i, known.get(i)) for i in record["experience_ids"]]
        first_action = next((i for i, m in enumerate(record["messages"]) if m["role"] == "assistant"),
                            len(record["messages"]))
        steps = turns(record)
        orphan = [(t, m, a) for t, m, s, a in zip(record["response_tokens"], record["loss_mask"], record["step_ids"],
                                                  record["advantages"], strict=False) if s < 0]
        return page("trajectory.jinja", run=run, r=record, entry=entry, turns=steps, injected=injected,
                    prompt_messages=record["messages"][:first_action], group=rollouts.group(run, entry),
                    orphan=token_spans(orphan) if orphan else None,
                    prompt_spans=token_spans([(t, 0, None) for t in record["prompt_tokens"]]))

    @app.get("/runs/{name}/tasks", response_class=HTMLResponse)
    async def tasks_page(name: str, request: Request) -> Response:
        run = root.run(name)
        probe = await load_tasks(run, 0, 1)
        total = probe.total if probe else 0
        number, pages, offset = paginate(request.query_params.get("page"), total, settings.page_size)
        view = await load_tasks(run, offset, settings.page_size) if probe else None
        curve = line_chart("training pass rate by step (rollout success)", pass_rates_by_step(rollouts.index(run)))
        return page("tasks.jinja", run=run, view=view, page=number, pages=pages, curve=curve)

    @app.get("/runs/{name}/experiences", response_class=HTMLResponse)
    async def experiences_page(name: str, request: Request) -> Response:
        run = root.run(name)
        pool = await load_pool(run, lines)
        experiences = sorted(pool.experiences, key=lambda e: e.created_at)
        number, pages, offset = paginate(request.query_params.get("page"), len(experiences), settings.page_size)
        query = (request.query_params.get("q") or "").strip()[:500]
        found = await search_pool(run, query) if query else None
        return page("experiences.jinja", run=run, pool=pool, rows=experiences[offset:offset + settings.page_size],
                    users=rollouts.users(run), page=number, pages=pages, query=query,
                    found=found if not isinstance(found, str) else None,
                    search_error=found if isinstance(found, str) else None)

    @app.get("/runs/{name}/experiences/{experience_id}", response_class=HTMLResponse)
    async def experience_page(name: str, experience_id: str) -> Response:
        run = root.run(name)
        pool = await load_pool(run, lines)
        experience = next((e for e in pool.experiences if e.experience_id == experience_id), None)
        if experience is None:
            raise StudioError(404, "experience not found", f"the pool of run {run.name!r} (workspace "
                                                            f"{pool.workspace!r}) has no experience "
                                                            f"{experience_id[:80]!r}")
        return page("experience.jinja", run=run, e=experience, pool=pool,
                    used_by=rollouts.users(run).get(experience_id, []))

    @app.get("/runs/{name}/logs/{log}", response_class=HTMLResponse)
    async def log_page(name: str, log: str) -> Response:
        run = root.run(name)
        return page("log.jinja", run=run, log=log, text=log_tail(run, log))

    return app


def _safe_next(target: str) -> str:
    """Only a path on this site: `//host` or a scheme would make the login form an open redirect."""
    return target if target.startswith("/") and not target.startswith("//") and "\\" not in target else "/"


def _run_row(run: Run, lines: JsonLines) -> dict[str, Any]:
    records = lines.read(run.trainer_dir / "metrics.jsonl")
    last = records[-1] if records else {}
    latest_reward = next((r["rollout/reward_mean"] for r in reversed(records) if "rollout/reward_mean" in r), None)
    evals = {k: v for r in records for k, v in r.items() if k.startswith("eval/avg@")}
    steps = max((int(r.get("step", 0)) for r in records), default=0)
    return {"run": run, "status": run.status, "steps": steps, "reward": latest_reward,
            "eval": next(iter(evals.items()), None), "last_step": last.get("step")}


def _live_context(run: Run, lines: JsonLines) -> dict[str, Any]:
    records = lines.read(run.trainer_dir / "metrics.jsonl")
    charts = [line_chart(title, series_from(records, keys)) for title, keys in curve_keys(records).items()]
    counters: dict[str, float] = {}
    for r in records:
        counters.update({k: v for k, v in r.items() if k.startswith(COUNTER_PREFIXES)})
    summary = run.summary or {}
    return {"status": run.status, "charts": charts, "counters": sorted(counters.items()),
            "steps": max((int(r.get("step", 0)) for r in records), default=0), "records": len(records),
            "eval": summary.get("eval") or {}, "mechanisms": summary.get("mechanisms") or {},
            "collapse": summary.get("collapse")}


def _logs(run: Run) -> list[str]:
    if not run.logs_dir.is_dir():
        return []
    return sorted(p.name for p in run.logs_dir.glob("*.log"))


def _manifest_view(run: Run) -> dict[str, Any] | None:
    manifest = run.manifest
    if manifest is None:
        return None
    return {k: v for k, v in manifest.items() if k != "config"}  # the config is shown on its own
