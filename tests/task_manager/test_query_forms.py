"""The `names` query form of hindsight tasks, over real HTTP: the originals' information structure, no ids.

A synthesize job with `query_forms: [ids, names]` keeps, for a goal whose ids the exploration can describe,
a second task that names the passenger, the airline, the route and the date instead of ids. It is graded
like its id twin (state match): the reference's end state gets 1.0, an untouched instance 0.0.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter

import pytest

from env_service.client import EnvClient
from task_manager.client import TaskClient
from task_manager.envs import EnvAccess
from task_manager.models import Reference
from task_manager.replay import replay
from tests.helpers import run_service
from tests.task_manager.conftest import stored_rows, write_conf

pytestmark = pytest.mark.slow

IDS = re.compile(r"\bP\d{4}\b|\b[A-Z0-9]{2}\d{3,4}-\d{4}\b|\bORD\d+")  # passenger, flight and order ids


def test_names_form_tasks_carry_no_ids_and_grade_like_their_id_twins(flights_env, tmp_path):
    store = tmp_path / "store"
    conf = write_conf(tmp_path / "tm.yaml", flights_env.url, store, dedup={"embeddings": False},
                      synthesis={"query_forms": ["ids", "names"]})
    with run_service("task_manager", ["--conf", str(conf)]) as service:

        async def scenario() -> None:
            async with TaskClient(service.url) as tasks, EnvClient(flights_env.url) as env:
                job = await tasks.submit_job("flights", episodes=8, seed=0)
                assert (await tasks.wait_job(job.job_id, timeout=180)).status == "done"
                served = (await tasks.list_tasks(env="flights", synthetic=True, limit=1000)).tasks
                forms = Counter(t.metadata.get("query_form") for t in served)
                assert forms["names"] >= 1 and forms["ids"] >= 1, forms

                rows = {row["task_id"]: row for row in stored_rows(store, "SELECT * FROM tasks WHERE synthetic = 1")}
                by_goal: dict[tuple[str, str], set[str]] = {}
                for task in served:
                    reference = Reference.model_validate_json(rows[task.task_id]["reference"])
                    key = (task.seed_task_id or "", json.dumps(reference.end_state, sort_keys=True))
                    by_goal.setdefault(key, set()).add(task.metadata["query_form"])
                    if task.metadata["query_form"] == "ids":
                        continue
                    assert not IDS.search(task.query or ""), task.query
                    assert re.search(r"\b(United|American|Delta|Alaska|JetBlue)\b", task.query or "")
                # Every names task has its id twin: the same seed and goal, an easier query.
                assert all("ids" in found for found in by_goal.values() if "names" in found)

                access = EnvAccess(env)
                names = [t for t in served if t.metadata["query_form"] == "names"][:2]
                for task in names:
                    reference = Reference.model_validate_json(rows[task.task_id]["reference"])
                    result = await replay(access, "flights", task.seed_task_id or "", reference.actions,
                                          query=task.query, recorded_initial_state=reference.initial_state,
                                          recorded_observations=reference.observations)
                    assert result.ok and await tasks.grade(task.task_id, state=result.end_state) == 1.0
                    created = await env.create("flights", task.env_task_id, params=task.create_params())
                    assert created.messages[-1].content == task.query
                    untouched = await env.state(created.instance_id)
                    await env.release(created.instance_id)
                    assert await tasks.grade(task.task_id, state=untouched.model_dump()) == 0.0

        asyncio.run(scenario())
