"""`mixture.pool_share`: the synthetic tasks that seed the experience pool are never trained on.

The first zero-human-data run of issue #14 seeded the pool from the same lookups it trained on: a rollout
was shown its own question's answer and was rewarded for copying it. With a pool share, seeding uses only
the pool's tasks, batches sample only the others, and tasks that give away the same answer (the ids and
names forms of one question, or two passengers with the same credit) fall on the same side.
Over real HTTP: env service, task manager and experience manager.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from common.http import ServiceCallError
from common.schemas import Task
from task_manager.client import TaskClient
from task_manager.models import Reference, StoredTask
from task_manager.seeding import giveaway, reserved_for_pool
from tests.experience_manager.conftest import write_conf as write_em_conf
from tests.helpers import free_port, run_service
from tests.task_manager.conftest import stored_rows, write_conf


def _stored(task_id: str, answer: str | None) -> StoredTask:
    return StoredTask(task=Task(task_id=task_id, env_type="flights", query="q", synthetic=True, split="train"),
                      reference=Reference(actions=["a"], answer=answer))


def test_tasks_giving_away_one_answer_fall_on_one_side():
    assert giveaway(_stored("syn-1", " 2500 ")) == giveaway(_stored("syn-2", "2500")) == "answer:2500"
    assert giveaway(_stored("syn-3", None)) == "task:syn-3"  # a goal: its demonstration is its own
    sides = [reserved_for_pool(_stored(f"syn-{i}", f"{i % 40}"), 0.3) for i in range(400)]
    # 40 answers, each shared by 10 tasks: every group is on one side, and about 30% of groups are the pool's.
    groups = {i % 40: set() for i in range(400)}
    for i, side in enumerate(sides):
        groups[i % 40].add(side)
    assert all(len(g) == 1 for g in groups.values())
    assert 6 <= sum(next(iter(g)) for g in groups.values()) <= 18
    assert not any(reserved_for_pool(_stored(f"syn-{i}", str(i)), 0.0) for i in range(100))


def test_seeded_and_trained_synthetic_tasks_are_disjoint_over_http(flights_env, tmp_path):
    em_port = free_port()
    tm_conf = write_conf(tmp_path / "tm.yaml", flights_env.url, tmp_path / "tm", dedup={"embeddings": False},
                         experience_url=f"http://127.0.0.1:{em_port}",
                         synthesis={"kinds": ["lookup"], "query_forms": ["ids", "names"]},
                         mixture={"synthetic_ratio": 1.0, "use_original": False, "pool_share": 0.4},
                         curriculum={"enabled": False})
    em_conf = write_em_conf(tmp_path / "em.yaml", {"summary": {"mode": "heuristic"}})
    with run_service("task_manager", ["--conf", str(tm_conf)]) as tm, \
            run_service("experience_manager", ["--store", str(tmp_path / "em"), "--conf", em_conf], port=em_port):

        async def scenario() -> None:
            async with TaskClient(tm.url) as tasks:
                job = await tasks.wait_job((await tasks.submit_job("flights", episodes=4)).job_id, timeout=120)
                assert job.status == "done", job
                synthetic = (await tasks.list_tasks(env="flights", synthetic=True, limit=1000)).tasks
                answers = {r["task_id"]: json.loads(r["reference"])["answer"]
                           for r in stored_rows(tmp_path / "tm", "SELECT task_id, reference FROM tasks")}
                seeded = await tasks.seed_experience("flights", "pool", limit=1000)
                sampled = {t.task_id for seed in range(30)
                           for t in await tasks.sample_batch(4, env="flights", seed=seed)}
                pool = set(seeded.task_ids)
                assert pool and sampled, (pool, sampled)
                assert not pool & sampled
                assert pool | sampled <= {t.task_id for t in synthetic}
                assert seeded.kept_for_training == len(synthetic) - len(pool) - seeded.refused
                # No answer a demonstration shows is an answer a training task is rewarded for.
                assert not {answers[i] for i in pool} & {answers[i] for i in sampled}
                stats = await tasks.stats()
                assert stats["environments"]["flights"]["pool_only"] == len(pool)
                # Naming a training task to seed is refused, and says why.
                with pytest.raises(ServiceCallError) as refused:
                    await tasks.seed_experience("flights", "pool", task_ids=[sorted(sampled)[0]])
                assert (refused.value.status, refused.value.code) == (400, "not_seedable")
                assert "pool_share" in refused.value.message

        asyncio.run(scenario())
