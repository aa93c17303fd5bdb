"""Pool seeding from self-questioning, over real HTTP: env service, task manager, experience manager.

A real synthesize job makes verified synthetic tasks from train tasks, then the launcher's synthesis gate
(`launcher.synthesis.seed_experience`) seeds the pool; one more synthetic task, grown from a
validation task, is planted in the store beforehand. Seeding must replay the references (real observations)
into the pool, leave the planted task out, and refuse by name any held-out or original task it is given.
"""

from __future__ import annotations

import asyncio

import pytest

from common.http import ServiceCallError
from common.schemas import Task
from evolver_launcher.synthesis import SynthesisGate
from experience_manager.client import ExperienceClient
from task_manager.client import TaskClient
from task_manager.models import Call, Reference, StoredTask
from task_manager.store import TaskStore
from tests.experience_manager.conftest import write_conf as write_em_conf
from tests.helpers import free_port, run_service
from tests.launcher.test_synthesis import poll
from tests.task_manager.conftest import write_conf

pytestmark = pytest.mark.slow

HELD_OUT_SEEDED = "syn-grownfromvalidation01"


def _plant_held_out(store_dir) -> None:
    """A synthetic task whose seed task is a validation task: it must never reach the pool."""
    store = TaskStore(store_dir / "tasks.sqlite")
    call = Call(name="get_passenger", arguments={"name": "Alice Wang"})
    reference = Reference(actions=[call.render()], calls=[call], observations=["{}"], end_state={"orders": []})
    task = Task(task_id=HELD_OUT_SEEDED, env_type="flights", split="train", synthetic=True,
                seed_task_id="validation-0001", query="Look up Alice Wang.", metadata={"synthesizer": "hindsight"})
    store.add_task(StoredTask(task=task, reference=reference, signature="sig-held-out", synthesizer="hindsight"),
                   goal_key="goal-held-out")
    store.close()


def test_seeding_replays_synthetic_references_into_the_pool_and_no_held_out_task_reaches_it(flights_env, tmp_path):
    store_dir = tmp_path / "tm"
    store_dir.mkdir()
    _plant_held_out(store_dir)
    em_port = free_port()
    # The task manager sends replayed references only to the experience manager its config names.
    tm_conf = write_conf(tmp_path / "tm.yaml", flights_env.url, store_dir, dedup={"embeddings": False},
                         experience_url=f"http://127.0.0.1:{em_port}")
    em_conf = write_em_conf(tmp_path / "em.yaml", {"summary": {"mode": "heuristic"}})
    with run_service("task_manager", ["--conf", str(tm_conf)]) as tm, \
            run_service("experience_manager", ["--store", str(tmp_path / "em"), "--conf", em_conf],
                        port=em_port) as em:

        async def synthesize() -> None:
            async with TaskClient(tm.url) as tasks:
                job = await tasks.submit_job("flights", episodes=2)
                assert (await tasks.wait_job(job.job_id, timeout=120)).status == "done"

        # The job runs first, so the planted task is not why the gate finds synthetic tasks (it then seeds
        # without a job of its own, as for a resumed run).
        asyncio.run(synthesize())
        said: list[str] = []
        gate = SynthesisGate(tm.url, ["flights"], episodes=2, timeout_s=120, say=said.append,
                             seed_experience=True, workspace="seeded", run_name="unit")
        assert poll(gate), said
        counters = gate.results["flights"]["seeding"]
        assert any("self-navigating seeded from self-questioning" in line for line in said)

        async def scenario() -> None:
            async with TaskClient(tm.url) as tasks, ExperienceClient(em.url) as pool:
                synthetic = (await tasks.list_tasks(env="flights", synthetic=True, limit=1000)).tasks
                from_train = [t.task_id for t in synthetic if t.task_id != HELD_OUT_SEEDED]
                assert from_train, "the job kept no synthetic task to seed from"
                assert counters["candidates"] == len(from_train) and counters["refused"] == 1
                assert counters["replayed"] == counters["sent"] == len(from_train) and counters["replay_failed"] == 0
                assert counters["experiences_created"] >= 1
                assert (await tasks.stats())["seeding"]["flights"]["sent"] == len(from_train)

                experiences = await pool.list_experiences("seeded")
                seeded_from = {tid for e in experiences for tid in e.provenance.task_ids}
                assert seeded_from and seeded_from <= set(from_train)
                assert not any(t.startswith(("validation", "test")) or t == HELD_OUT_SEEDED for t in seeded_from)
                # The cases hold the replayed reference's calls (each ends in a state change): the pool learned
                # from the synthetic tasks what to call.
                assert all("succeeded" in e.content and ("book_ticket(" in e.content or "cancel_order(" in e.content)
                           for e in experiences), [e.content for e in experiences]
                # Each replayed reference is also kept whole as a demonstration (inject: turns): the synthetic
                # query, the reference's calls as the task manager renders them, the environment's observations.
                queries = {t.task_id: t.query for t in synthetic}
                for e in experiences:
                    demo = e.demonstration
                    assert demo, e
                    # (an experience that absorbed a near-duplicate keeps one of its sources' demonstrations)
                    assert demo[0].role == "user" and demo[0].content in {queries[t] for t in e.provenance.task_ids}
                    calls = [m for m in demo if m.role == "assistant"]
                    observations = [m for m in demo if m.role == "tool"]
                    assert calls and all(m.content.startswith("<tool_call>") for m in calls)
                    assert len(observations) == len(calls) and all(m.content for m in observations)
                hit = (await pool.retrieve("seeded", queries[experiences[0].provenance.task_ids[0]])).experiences[0]
                assert hit.demonstration and hit.demonstration[0]["role"] == "user"
                pool_size = (await pool.stats("seeded"))["active"]

                # Named held-out, original and validation-grown tasks are refused by name; nothing is sent.
                for bad, why in (("validation-0000", "validation task"), ("test-0003", "test task"),
                                 ("train-0000", "not a synthetic task"), (HELD_OUT_SEEDED, "not a train task")):
                    with pytest.raises(ServiceCallError) as refused:
                        await tasks.seed_experience("flights", "seeded", task_ids=[from_train[0], bad])
                    error = refused.value
                    assert (error.status, error.code) == (400, "not_seedable")
                    assert bad in error.message and why in error.message, error.message
                # A caller cannot send the references anywhere else: the request has no URL to give.
                with pytest.raises(ServiceCallError) as elsewhere:
                    await tasks.post("/v1/seed_experience", json={"env": "flights", "experience_url": "http://x.test"})
                assert elsewhere.value.status == 422 and "experience_url" in str(elsewhere.value)
                assert (await pool.stats("seeded"))["active"] == pool_size

        asyncio.run(scenario())
