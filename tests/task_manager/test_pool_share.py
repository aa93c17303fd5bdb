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
import re

import pytest

from common.http import ServiceCallError
from common.schemas import Task
from task_manager.client import TaskClient
from task_manager.models import Reference, StoredTask
from task_manager.seeding import giveaway, gives_away, shown_records, split_for_pool
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


def test_every_kind_with_two_answers_seeds_and_what_a_demonstration_gives_away_is_withheld():
    alice = {"passenger_id": "P1001", "name": "Alice Wang", "travel_credit": 800}
    flights = [{"flight_id": "UA100-0603", "origin": "SFO", "price": 120, "seats_left": 3},
               {"flight_id": "DL200-0603", "origin": "SFO", "price": 99, "seats_left": 0}]

    def task(task_id: str, query: str, answer: str, lookup: str, *observations: object) -> StoredTask:
        stored = _stored(task_id, answer, lookup, observations)
        return stored.model_copy(update={"task": stored.task.model_copy(update={"query": query})})

    tasks = [task("credit-alice", "How much credit does Alice Wang have?", "800", "credit_lookup", alice),
             task("credit-bob", "How much credit does P1002 have?", "500", "credit_lookup",
                  {"passenger_id": "P1002", "travel_credit": 500}),
             task("id-alice", "What is the passenger id of Alice Wang?", "P1001", "id_lookup", alice),
             task("id-carl", "What is the passenger id of Carl Diaz?", "P1003", "id_lookup",
                  {"passenger_id": "P1003", "name": "Carl Diaz", "travel_credit": 800}),
             task("fare-sfo", "Cheapest fare from SFO on June 3?", "99", "fare_lookup", flights),
             task("fare-bos", "Cheapest fare from BOS on June 3?", "140", "fare_lookup",
                  [{"flight_id": "AA300-0603", "origin": "BOS", "price": 140, "seats_left": 1}]),
             task("seats-ua", "How many seats are left on UA100-0603?", "3", "seats_lookup", flights),
             task("credit-dana", "How much credit does Dana Okafor have?", "800", "credit_lookup",
                  {"passenger_id": "P1004", "name": "Dana Okafor", "travel_credit": 800})]
    split = split_for_pool(tasks, 0.3)
    # One answer group of each kind with two groups or more (which one: the hash); seats has one group: none.
    assert len(split.pool & {"credit-alice", "credit-dana", "credit-bob"}) in (1, 2)  # alice and dana: one group
    assert ("credit-alice" in split.pool) == ("credit-dana" in split.pool)
    assert len(split.pool & {"id-alice", "id-carl"}) == 1 and len(split.pool & {"fare-sfo", "fare-bos"}) == 1
    assert "seats-ua" not in split.pool
    # Withheld: a pool record holding the answer beside what the query names, never a mere equal value.
    shown = [r for t in tasks if t.task.task_id in split.pool for r in shown_records(t)]
    expected = {t.task.task_id for t in tasks if t.task.task_id not in split.pool and gives_away(shown, t)}
    assert split.withheld == expected
    assert split.training == {t.task.task_id for t in tasks} - split.pool - split.withheld
    alice_record = shown_records(tasks[0])
    assert gives_away(alice_record, tasks[2])  # Alice's record answers "the id of Alice Wang"
    assert not gives_away(alice_record, tasks[3])  # Carl's credit is 800 too, but nothing names Carl
    assert gives_away(shown_records(tasks[4]), tasks[6])  # the SFO search lists UA100-0603's seats
    assert not gives_away(shown_records(tasks[5]), tasks[6])


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
                queries = {t.task_id: t.query for t in synthetic}
                for i in sampled:  # nor does a pool demonstration show the record a training task asks about
                    named = re.findall(r"\bP\d{4}\b|\b[A-Z0-9]{2}\d{2,4}-\d{4}\b", queries[i])
                    assert not any(f'"{n}"' in shown for n in named if n != answers[i]) or answers[i] not in shown, i
                stats = await tasks.stats()
                assert stats["environments"]["flights"]["pool_only"] == len(pool)
                # Naming a training task to seed is refused, and says why.
                with pytest.raises(ServiceCallError) as refused:
                    await tasks.seed_experience("flights", "pool", task_ids=[sorted(sampled)[0]])
                assert (refused.value.status, refused.value.code) == (400, "not_seedable")
                assert "pool_share" in refused.value.message

        asyncio.run(scenario())
