"""The experience pool and the task store of a run: from the live services, else from the run folder.

While a run is live the studio asks the experience manager and the task manager through their typed
clients (short timeouts: a page never hangs on a busy service). Once they stop, it reads what they
left in the run folder: the experience manager's journal (every intent carries the absolute end
state of each experience it touched, and a compaction's snapshot the whole pool, so replaying it gives
the pool) and the task manager's SQLite
store, opened read-only. The `reference` column is never selected: reference solutions stay with
the task manager.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.schemas import Experience
from experience_manager.client import ExperienceClient, RetrievalResult
from studio.runs import JsonLines, Run
from task_manager.client import TaskClient

LIVE_TIMEOUT_S = 3.0
TASK_COLUMNS = ("task_id, env_type, seed_task_id, query, split, synthetic, synthesizer, confidence, job_id, "
                "created_at")


@dataclass
class Pool:
    experiences: list[Experience]
    source: str  # where the list came from, shown on the page
    workspace: str


def workspace_of(run: Run) -> str:
    return str((run.section("trainer").get("experience") or {}).get("workspace") or "default")


def journal_path(run: Run) -> Path | None:
    store = run.section("experience_manager").get("store")
    if store:
        return Path(store) / "journal.jsonl"
    default = run.path / "experience_store" / "journal.jsonl"
    return default if default.is_file() else None


def replay_journal(records: list[dict[str, Any]], workspace: str) -> list[Experience]:
    pool: dict[str, dict[str, Any]] = {}
    for record in records:
        if record.get("t") not in ("intent", "snapshot") or record.get("ws") != workspace:
            continue
        if record.get("drop") or record.get("t") == "snapshot":
            pool.clear()
        for write in record.get("writes") or []:
            if "upsert" in write:
                pool[write["upsert"]["experience_id"]] = write["upsert"]
            elif "delete" in write:
                pool.pop(write["delete"], None)
    return [Experience.model_validate(e) for e in pool.values()]


_replayed: dict[tuple[Path, str], tuple[tuple[int, int], list[Experience]]] = {}


def pool_from_journal(path: Path, workspace: str, lines: JsonLines) -> list[Experience]:
    """The replayed pool, recomputed only when the journal changed (size or mtime)."""
    st = path.stat()
    key = (st.st_size, st.st_mtime_ns)
    hit = _replayed.get((path, workspace))
    if hit is None or hit[0] != key:
        hit = _replayed[(path, workspace)] = (key, replay_journal(lines.read(path), workspace))
    return hit[1]


async def load_pool(run: Run, lines: JsonLines) -> Pool:
    workspace = workspace_of(run)
    url = run.service_url("experience_manager")
    if url:
        try:
            async with ExperienceClient(url, timeout=LIVE_TIMEOUT_S, retries=0) as client:
                experiences = await client.list_experiences(workspace, status="all", limit=10_000)
            return Pool(experiences, f"live experience manager {url}", workspace)
        except Exception as exc:  # a busy or stopping service: fall back to the run folder
            source_note = f" (live service unavailable: {type(exc).__name__})"
        else:  # pragma: no cover
            source_note = ""
    else:
        source_note = ""
    path = journal_path(run)
    if path is None or not path.is_file():
        return Pool([], "no experience manager in this run" + source_note, workspace)
    return Pool(pool_from_journal(path, workspace, lines), f"run folder ({path.name}){source_note}", workspace)


async def search_pool(run: Run, query: str) -> RetrievalResult | str:
    """The experience manager's own retrieval for a query, or why it cannot run now."""
    url = run.service_url("experience_manager")
    if url is None:
        return ("search calls the experience manager's retrieve, which runs only while the run is live; "
                "this run's service is stopped")
    try:
        async with ExperienceClient(url, timeout=30.0, retries=0) as client:
            return await client.retrieve(workspace_of(run), query)
    except Exception as exc:
        return f"the experience manager did not answer ({type(exc).__name__}: {str(exc)[:200]})"


@dataclass
class TaskView:
    tasks: list[dict[str, Any]]
    total: int
    funnel: dict[str, Any]
    rejected: dict[str, int]
    dropped: dict[str, int]
    pass_rates: dict[str, tuple[float, int]]
    source: str


def _store_path(run: Run) -> Path | None:
    store = run.section("task_manager").get("store_dir")
    path = Path(store) / "tasks.sqlite" if store else run.path / "task_manager" / "tasks.sqlite"
    return path if path.is_file() else None


def _sum_reasons(jobs: list[dict[str, Any]], key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for job in jobs:
        for reason, count in ((job.get("progress") or {}).get(key) or {}).items():
            out[reason] = out.get(reason, 0) + int(count)
    return out


def _funnel(jobs: list[dict[str, Any]]) -> dict[str, int]:
    keys = ("episodes_done", "proposed", "parsed", "verified", "kept")
    return {k: sum(int((j.get("progress") or {}).get(k, 0)) for j in jobs) for k in keys}


async def _live_tasks(url: str, offset: int, limit: int) -> TaskView:
    async with TaskClient(url, timeout=LIVE_TIMEOUT_S, retries=0) as client:
        page = await client.list_tasks(limit=limit, offset=offset)
        jobs = [j.model_dump() for j in await client.jobs()]
        tasks = []
        for task in page.tasks:
            detail = await client.get_task(task.task_id, env=task.env_type)
            tasks.append({**task.model_dump(), "pass_rate": detail.pass_rate, "rollouts": detail.rollouts,
                          "synthesizer": task.metadata.get("synthesizer"), "job_id": task.metadata.get("job_id")})
    rates = {t["task_id"]: (t["pass_rate"], t["rollouts"]) for t in tasks if t["pass_rate"] is not None}
    return TaskView(tasks, page.total, _funnel(jobs), _sum_reasons(jobs, "rejected"), _sum_reasons(jobs, "dropped"),
                    rates, f"live task manager {url}")


def _stored_tasks(path: Path, offset: int, limit: int) -> TaskView:
    """Synthetic tasks from the store, then the original tasks the trainer reported pass rates for (the
    store keeps originals only as curriculum entries: the environment owns them)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2.0)
    db.row_factory = sqlite3.Row
    try:
        rows = [dict(r) for r in db.execute(f"SELECT {TASK_COLUMNS} FROM tasks ORDER BY created_at, task_id")]
        jobs = [{"progress": json.loads(r["progress"])} for r in db.execute("SELECT progress FROM jobs")]
        rates = {}
        for r in db.execute("SELECT task_id, recent, total FROM pass_rates ORDER BY task_id"):
            recent = json.loads(r["recent"])
            rates[r["task_id"]] = (sum(recent) / len(recent) if recent else 0.0, int(r["total"]))
    finally:
        db.close()
    stored = {f"{r['env_type']}/{r['task_id']}" for r in rows}
    for key in rates:  # pass rates are kept per "env/task_id"
        if key not in stored and "/" in key:
            env, task_id = key.split("/", 1)
            rows.append({"task_id": task_id, "env_type": env, "synthetic": False, "query": None})
    tasks = []
    for r in rows[offset:offset + limit]:
        rate = rates.get(f"{r['env_type']}/{r['task_id']}")
        tasks.append({**r, "synthetic": bool(r["synthetic"]), "pass_rate": rate[0] if rate else None,
                      "rollouts": rate[1] if rate else 0})
    return TaskView(tasks, len(rows), _funnel(jobs), _sum_reasons(jobs, "rejected"), _sum_reasons(jobs, "dropped"),
                    rates, f"run folder ({path.name}, read-only)")


async def load_tasks(run: Run, offset: int, limit: int) -> TaskView | None:
    url = run.service_url("task_manager")
    if url:
        try:
            return await _live_tasks(url, offset, limit)
        except Exception:  # a busy or stopping service: the store in the run folder says the same
            pass
    path = _store_path(run)
    if path is None:
        return None
    return _stored_tasks(path, offset, limit)
