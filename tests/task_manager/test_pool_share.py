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
from task_manager.seeding import giveaway, shown_values, split_for_pool
from tests.experience_manager.conftest import write_conf as write_em_conf
from tests.helpers import free_port, run_service
from tests.task_manager.conftest import stored_rows, write_conf


def _stored(task_id: str, answer: str | None, lookup: str = "credit_lookup",
            observations: tuple[dict, ...] = ()) -> StoredTask:
    return StoredTask(task=Task(task_id=task_id, env_type="flights", query="q", synthetic=True, split="train",
                                metadata={"kind": "lookup", "lookup": lookup}),
                      reference=Reference(actions=["a"], answer=answer,
                                          observations=[json.dumps(o) for o in observations]))


def test_tasks_giving_away_one_answer_fall_on_one_side():
    assert giveaway(_stored("syn-1", " 2500 ")) == giveaway(_stored("syn-2", "2500")) == "answer:2500"
    # 40 answers, each shared by 10 tasks: every group is on one side, and round(0.3 * 40) = 12 groups seed.
    tasks = [_stored(f"syn-{i}", f"{1000 + i % 40}") for i in range(400)]
    split = split_for_pool(tasks, 0.3)
    assert len(split.pool) == 120 and not split.withheld and len(split.training) == 280
    for g in range(40):
        assert len({f"syn-{i}" in split.pool for i in range(g, 400, 40)}) == 1
    assert split_for_pool(tasks, 0.0).training == {t.task.task_id for t in tasks}  # off: everything trains


def test_every_kind_with_two_answers_seeds_and_what_a_demonstration_shows_is_withheld():
    alice = {"passenger_id": "P1", "name": "Alice", "travel_credit": 800}
    flights = [{"flight_id": "UA1", "price": 120, "seats_left": 3}, {"flight_id": "DL2", "price": 99, "seats_left": 0}]
    tasks = [_stored("credit-alice", "800", "credit_lookup", (alice,)),
             _stored("credit-bob", "500", "credit_lookup", ({"passenger_id": "P2", "travel_credit": 500},)),
             _stored("id-alice", "P1", "id_lookup", (alice,)),
             _stored("fare-1", "99", "fare_lookup", (flights,)),
             _stored("fare-2", "140", "fare_lookup", ([{"flight_id": "AA3", "price": 140, "seats_left": 1}],)),
             _stored("seats-ua1", "3", "seats_lookup", (flights,))]  # one answer group: never seeds
    split = split_for_pool(tasks, 0.3)
    # One group of each kind with two groups or more (which one: the hash), never the single seats group.
    assert len(split.pool & {"credit-alice", "credit-bob"}) == 1 and len(split.pool & {"fare-1", "fare-2"}) == 1
    assert "seats-ua1" not in split.pool
    shown = set().union(*(shown_values(t) for t in tasks if t.task.task_id in split.pool))
    for task in tasks:
        tid = task.task.task_id
        if tid not in split.pool:  # withheld exactly when a pool demonstration shows its answer
            assert (tid in split.withheld) == (task.reference.answer.lower() in shown), tid
            assert (tid in split.training) != (tid in split.withheld)
    assert shown_values(tasks[0]) == {"800", "p1", "alice"}


def test_seeded_and_trained_synthetic_tasks_are_disjoint_over_http(flights_env, tmp_path):
    em_port = free_port()
    tm_conf = write_conf(tmp_path / "tm.yaml", flights_env.url, tmp_path / "tm", dedup={"embeddings": False},
                         experience_url=f"http://127.0.0.1:{em_port}",
                         synthesis={"kinds": ["lookup"], "query_forms": ["ids", "names"]},
                         mixture={"synthetic_ratio": 1.0, "use_original": False, "pool_share": 0.3},
                         curriculum={"enabled": False})
    em_conf = write_em_conf(tmp_path / "em.yaml", {"summary": {"mode": "heuristic"}})
    with run_service("task_manager", ["--conf", str(tm_conf)]) as tm, \
            run_service("experience_manager", ["--store", str(tmp_path / "em"), "--conf", em_conf], port=em_port):

        async def scenario() -> None:
            async with TaskClient(tm.url) as tasks:
                job = await tasks.wait_job((await tasks.submit_job("flights", episodes=8)).job_id, timeout=120)
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
                shown = " ".join(o for r in stored_rows(tmp_path / "tm", "SELECT task_id, reference FROM tasks")
                                 if r["task_id"] in pool for o in json.loads(r["reference"])["observations"])
                for i in sampled:  # nor does any pool demonstration's observation show it
                    assert not any(f"{a}{answers[i]}{b}" in shown for a in ('"', ": ") for b in ('"', ",", "}")), i
                stats = await tasks.stats()
                assert stats["environments"]["flights"]["pool_only"] == len(pool)
                # Naming a training task to seed is refused, and says why.
                with pytest.raises(ServiceCallError) as refused:
                    await tasks.seed_experience("flights", "pool", task_ids=[sorted(sampled)[0]])
                assert (refused.value.status, refused.value.code) == (400, "not_seedable")
                assert "pool_share" in refused.value.message

        asyncio.run(scenario())
