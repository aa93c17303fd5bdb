"""Acceptance on `flights` with no LLM: random explorer + hindsight synthesizer, over real HTTP.

At least 50 verified tasks from at most 200 exploration episodes, distinct by their reference's
operation sequence, most needing two or more calls, no duplicates, each replaying to its
reference end state; grading gives 1.0 to a rollout that reaches that state and 0.0 otherwise.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.schemas import Task
from env_service.client import EnvClient
from task_manager.client import TaskClient
from task_manager.dedup import normalize_text
from task_manager.envs import EnvAccess
from task_manager.models import Reference
from task_manager.replay import replay
from tests.helpers import ServiceProcess, run_service
from tests.task_manager.conftest import stored_rows, write_conf

pytestmark = pytest.mark.slow

EPISODES = 70  # well under the 200 allowed
ORDER_ID = re.compile(r"^ORD\d+[0-9A-F]+$")  # flights' generated order numbers


@pytest.fixture(scope="module")
def synthesized(flights_env: ServiceProcess, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[ServiceProcess, Path, dict]]:
    root = tmp_path_factory.mktemp("tm")
    store = root / "store"
    conf = write_conf(root / "tm.yaml", flights_env.url, store)
    with run_service("task_manager", ["--conf", str(conf)]) as service:
        import asyncio

        async def run() -> dict:
            async with TaskClient(service.url) as client:
                job = await client.submit_job("flights", episodes=EPISODES, seed=0)
                return (await client.wait_job(job.job_id, timeout=300)).model_dump()

        job = asyncio.run(run())
        yield service, store, job


def _references(store: Path) -> list[tuple[dict, Reference]]:
    rows = stored_rows(store, "SELECT * FROM tasks WHERE synthetic = 1")
    return [(dict(row), Reference.model_validate_json(row["reference"])) for row in rows]


def _operation_sequence(reference: Reference) -> tuple:
    """Name and arguments of every call, generated order numbers masked (computed here, not by the service)."""
    assert reference.calls is not None
    return tuple((c.name, tuple(sorted((k, "<order>" if ORDER_ID.match(str(v)) else v)
                                       for k, v in c.arguments.items()))) for c in reference.calls)


def test_fifty_distinct_verified_tasks(synthesized: tuple[ServiceProcess, Path, dict]) -> None:
    _, store, job = synthesized
    progress = job["progress"]
    assert job["status"] == "done", job
    assert progress["episodes_done"] == EPISODES <= 200
    assert progress["verified"] >= progress["kept"] >= 50, progress
    references = _references(store)
    assert len(references) == progress["kept"]
    sequences = [_operation_sequence(ref) for _, ref in references]
    assert len(set(sequences)) == len(sequences) >= 50
    multi_call = sum(1 for seq in sequences if len(seq) >= 2)
    assert multi_call > len(sequences) / 2, f"only {multi_call} of {len(sequences)} need two or more calls"
    # No duplicates by any measure: ids, wording, reference, goal.
    for column in ("task_id", "signature", "goal_key"):
        values = [row[column] for row, _ in references]
        assert len(set(values)) == len(values), column
    queries = [normalize_text(row["query"]) for row, _ in references]
    assert len(set(queries)) == len(queries)
    assert all(ref.end_state is not None and ref.end_state != {"orders": [], "travel_credit": {}}
               for _, ref in references)


async def test_each_reference_replays_to_its_end_state_and_grades(
        synthesized: tuple[ServiceProcess, Path, dict], flights_env: ServiceProcess) -> None:
    service, store, _ = synthesized
    async with EnvClient(flights_env.url) as env, TaskClient(service.url) as tasks:
        access = EnvAccess(env)
        for row, reference in _references(store):
            result = await replay(access, "flights", row["seed_task_id"], reference.actions, query=row["query"],
                                  recorded_initial_state=reference.initial_state,
                                  recorded_observations=reference.observations)
            assert result.ok, (row["task_id"], result.error)
            assert result.end_state["comparable"] == reference.end_state, row["task_id"]
            # The whole state response, or just its state, as a trainer would send it.
            assert await tasks.grade(row["task_id"], state=result.end_state) == 1.0
            # Stopping before the last (state-changing) action misses the goal.
            partial = await replay(access, "flights", row["seed_task_id"], reference.actions[:-1], query=row["query"],
                                   recorded_initial_state=reference.initial_state,
                                   recorded_observations=reference.observations)
            assert await tasks.grade(row["task_id"], state=partial.end_state) == 0.0
            created = await env.create("flights", row["seed_task_id"], params={"query": row["query"]})
            snapshot = await env.state(created.instance_id)
            await env.release(created.instance_id)
            graded = await tasks.grade_detail(row["task_id"], state=snapshot.model_dump())
            assert (graded.reward, graded.method) == (0.0, "state_match")


async def test_served_tasks_start_on_their_seed(synthesized: tuple[ServiceProcess, Path, dict],
                                                flights_env: ServiceProcess) -> None:
    service, _, job = synthesized
    async with TaskClient(service.url) as tasks, EnvClient(flights_env.url) as env:
        page = await tasks.list_tasks(env="flights", synthetic=True, limit=10_000)
        assert page.total == job["progress"]["kept"]
        task: Task = page.tasks[0]
        assert task.synthetic and task.seed_task_id and task.query
        created = await env.create("flights", task.env_task_id, params=task.create_params())
        assert created.messages[-1].content == task.query
        await env.release(created.instance_id)
        batch = await tasks.sample_batch_detail(16, synthetic_ratio=0.5, seed=3)
        assert (batch.original, batch.synthetic) == (8, 8)
        stats = await tasks.stats()
        assert stats["environments"]["flights"]["synthetic"] == page.total
        assert stats["funnel"]["kept"] == page.total
        original = next(t for t in batch.tasks if not t.synthetic)
        with pytest.raises(Exception, match="original_task"):
            await tasks.grade(original.task_id, state={})
        print(json.dumps({"hindsight_job": job["progress"]}))
