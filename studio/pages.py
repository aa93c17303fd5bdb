"""The pages of runs: the list, one run (curves, counters, config, manifest), its rollouts, tasks,
experiences and logs. Paging is `?page=`; each route reads the run folder and, while live, the services.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from studio.charts import line_chart, series_from
from studio.context import StudioDep
from studio.rollouts import pass_rates_by_step, token_spans, turns
from studio.runs import JsonLines, Run, StudioError, log_tail
from studio.sources import load_pool, load_tasks, search_pool

COUNTER_PREFIXES = ("experience/", "tasks/", "judge/", "rollout/dropped_groups", "rollout/groups",
                    "rollout/env_error_rate")
# A mechanism's section of summary.json holds the trainer's counters and, under these keys, the services' own
# reports, which the tasks and experiences pages show.
SERVICE_REPORTS = ("service", "pool", "funnel_by_kind")


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


router = APIRouter()


@router.get("/", response_class=HTMLResponse)
async def runs_page(request: Request, studio: StudioDep) -> Response:
    runs, size = studio.root.runs(), studio.settings.page_size
    number, pages, offset = paginate(request.query_params.get("page"), len(runs), size)
    rows = [_run_row(run, studio.lines) for run in runs[offset:offset + size]]
    return studio.page("runs.jinja", rows=rows, root=str(studio.root.root), page=number, pages=pages)


@router.get("/runs/{name}", response_class=HTMLResponse)
async def run_page(name: str, studio: StudioDep) -> Response:
    run = studio.root.run(name)
    tensorboard = run.trainer_dir / "tensorboard"
    return studio.page("run.jinja", run=run, live=_live_context(run, studio.lines), logs=_logs(run),
                       manifest=_manifest_view(run), config_text=run.config_text,
                       rollouts=len(studio.rollouts.index(run)),
                       tensorboard=tensorboard if tensorboard.is_dir() else None)


@router.get("/runs/{name}/live", response_class=HTMLResponse)
async def run_live(name: str, studio: StudioDep) -> Response:
    run = studio.root.run(name)
    return studio.page("live.jinja", run=run, live=_live_context(run, studio.lines))


@router.get("/runs/{name}/rollouts", response_class=HTMLResponse)
async def rollouts_page(name: str, request: Request, studio: StudioDep) -> Response:
    run = studio.root.run(name)
    index, size = list(reversed(studio.rollouts.index(run))), studio.settings.page_size
    number, pages, offset = paginate(request.query_params.get("page"), len(index), size)
    return studio.page("rollouts.jinja", run=run, rows=index[offset:offset + size], total=len(index),
                       page=number, pages=pages)


@router.get("/runs/{name}/rollouts/{trajectory_id}", response_class=HTMLResponse)
async def trajectory_page(name: str, trajectory_id: str, studio: StudioDep) -> Response:
    run = studio.root.run(name)
    entry = studio.rollouts.entry(run, trajectory_id)
    record = studio.rollouts.record(run, trajectory_id)
    injected = []
    if record["experience_ids"]:
        pool = await load_pool(run, studio.lines)
        known = {e.experience_id: e for e in pool.experiences}
        injected = [(i, known.get(i)) for i in record["experience_ids"]]
    first_action = next((i for i, m in enumerate(record["messages"]) if m["role"] == "assistant"),
                        len(record["messages"]))
    steps = turns(record)
    orphan = [(t, m, a) for t, m, s, a in zip(record["response_tokens"], record["loss_mask"], record["step_ids"],
                                              record["advantages"], strict=False) if s < 0]
    return studio.page("trajectory.jinja", run=run, r=record, entry=entry, turns=steps, injected=injected,
                       prompt_messages=record["messages"][:first_action], group=studio.rollouts.group(run, entry),
                       orphan=token_spans(orphan) if orphan else None,
                       prompt_spans=token_spans([(t, 0, None) for t in record["prompt_tokens"]]))


@router.get("/runs/{name}/tasks", response_class=HTMLResponse)
async def tasks_page(name: str, request: Request, studio: StudioDep) -> Response:
    run = studio.root.run(name)
    probe = await load_tasks(run, 0, 1)
    total = probe.total if probe else 0
    number, pages, offset = paginate(request.query_params.get("page"), total, studio.settings.page_size)
    view = await load_tasks(run, offset, studio.settings.page_size) if probe else None
    curve = line_chart("training pass rate by step (rollout success)", pass_rates_by_step(studio.rollouts.index(run)))
    return studio.page("tasks.jinja", run=run, view=view, page=number, pages=pages, curve=curve)


@router.get("/runs/{name}/experiences", response_class=HTMLResponse)
async def experiences_page(name: str, request: Request, studio: StudioDep) -> Response:
    run = studio.root.run(name)
    pool = await load_pool(run, studio.lines)
    experiences, size = sorted(pool.experiences, key=lambda e: e.created_at), studio.settings.page_size
    number, pages, offset = paginate(request.query_params.get("page"), len(experiences), size)
    query = (request.query_params.get("q") or "").strip()[:500]
    found = await search_pool(run, query) if query else None
    return studio.page("experiences.jinja", run=run, pool=pool, rows=experiences[offset:offset + size],
                       users=studio.rollouts.users(run), page=number, pages=pages, query=query,
                       found=found if not isinstance(found, str) else None,
                       search_error=found if isinstance(found, str) else None)


@router.get("/runs/{name}/experiences/{experience_id}", response_class=HTMLResponse)
async def experience_page(name: str, experience_id: str, studio: StudioDep) -> Response:
    run = studio.root.run(name)
    pool = await load_pool(run, studio.lines)
    experience = next((e for e in pool.experiences if e.experience_id == experience_id), None)
    if experience is None:
        raise StudioError(404, "experience not found", f"the pool of run {run.name!r} (workspace "
                                                        f"{pool.workspace!r}) has no experience "
                                                        f"{experience_id[:80]!r}")
    return studio.page("experience.jinja", run=run, e=experience, pool=pool,
                       used_by=studio.rollouts.users(run).get(experience_id, []))


@router.get("/runs/{name}/logs/{log}", response_class=HTMLResponse)
async def log_page(name: str, log: str, studio: StudioDep) -> Response:
    run = studio.root.run(name)
    return studio.page("log.jinja", run=run, log=log, text=log_tail(run, log))


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
            "eval": summary.get("eval") or {}, "mechanisms": mechanism_counters(summary.get("mechanisms") or {}),
            "gateway": counter_rows(summary.get("agent") or {}), "collapse": summary.get("collapse")}


def mechanism_counters(mechanisms: dict[str, Any]) -> dict[str, list[tuple[str, Any]]]:
    """Each mechanism's counters as rows, the same for in-loop and gateway runs: a nested section (a gateway
    run's `self_questioning.agent`, the judge's labels by source) flattened into `section/key` rows, as the
    metrics log flattens them."""
    return {name: counter_rows(values, skip=SERVICE_REPORTS) for name, values in mechanisms.items()
            if isinstance(values, dict)}


def counter_rows(values: dict[str, Any], *, skip: tuple[str, ...] = (), prefix: str = "") -> list[tuple[str, Any]]:
    """The numbers and words of `values`, nested mappings flattened into `a/b` keys; lists are left out."""
    rows: list[tuple[str, Any]] = []
    for key, value in values.items():
        if key in skip:
            continue
        if isinstance(value, dict):
            rows += counter_rows(value, prefix=f"{prefix}{key}/")
        elif isinstance(value, (int, float, str)):
            rows.append((f"{prefix}{key}", value))
    return rows


def _logs(run: Run) -> list[str]:
    if not run.logs_dir.is_dir():
        return []
    return sorted(p.name for p in run.logs_dir.glob("*.log"))


def _manifest_view(run: Run) -> dict[str, Any] | None:
    manifest = run.manifest
    if manifest is None:
        return None
    return {k: v for k, v in manifest.items() if k != "config"}  # the config is shown on its own
