"""Leak canary: a reference solution never reaches anything the trainer can receive.

A synthetic task is planted in the store with a unique canary string in every part of its
reference (actions, calls, observations, initial state) and in its exploration record. Then every
route a trainer can call is exercised (task lists and pages, single tasks, batches, grading with
good and bad states and without one, feedback, stats, jobs, errors), a synthesize job runs, and
rollouts of the task, started exactly as the trainer starts them, go through the experience
manager's summarization into its pool. Those rollouts are also judged by judges that fetch the
task's reference from the task manager (the reference rule, and an LLM given the reference whose
every analysis quotes it). The canary must appear in no response, no INFO log line of the task
manager, no rollout, no experience and no judge response, stats or metrics.
The route that serves references to the trainer (`POST /v1/training_references`, its warm start)
is off unless the task manager is configured to serve them, and refuses here.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import httpx
import pytest

from common.schemas import ChatMessage, Step, Task, Trajectory
from env_service.client import EnvClient
from experience_manager.client import ExperienceClient
from judge.app import create_judge_app
from judge.client import JudgeClient
from judge.settings import JudgeSettings
from task_manager.client import TaskClient
from task_manager.models import Call, Exploration, ExploreStep, Reference, StoredTask
from task_manager.store import TaskStore
from tests.helpers import InProcessServer, ServiceProcess, run_service
from tests.judge.fake_judge_llm import fake_judge_llm
from tests.task_manager.conftest import write_conf

pytestmark = pytest.mark.slow

CANARY = f"CANARY-{uuid.uuid4().hex}"
TASK_ID = "syn-canary000000001"
END_STATE = {"orders": [{"passenger_id": "P1001", "flight_id": "UA1-0602", "price": 100, "status": "active"}],
             "travel_credit": {"P1001": 300}}


def _plant(store_dir: Path) -> None:
    store = TaskStore(store_dir / "tasks.sqlite")
    secret_call = Call(name="book_ticket", arguments={"passenger_id": "P1001", "flight_id": CANARY})
    reference = Reference(actions=[secret_call.render(), f"search_flight(origin='{CANARY}', destination='JFK')"],
                          calls=[secret_call], observations=[f'{{"order_id": "{CANARY}"}}', CANARY],
                          initial_state={"note": CANARY}, end_state=END_STATE, end_state_hash="h-canary")
    task = Task(task_id=TASK_ID, env_type="flights", split="train", synthetic=True, seed_task_id="train-0000",
                query="Book a seat for passenger P1001 on the cheapest flight you can find.",
                metadata={"synthesizer": "hindsight"})
    store.add_task(StoredTask(task=task, reference=reference, signature=f"sig-{CANARY}", synthesizer="hindsight"),
                   goal_key=f"goal-{CANARY}")
    with store.transaction() as db:
        store.insert_exploration(db, Exploration(env_type="flights", seed_task_id="train-0000", explorer="random",
                                                 job_id="planted", steps=[ExploreStep(
                                                     index=0, phase="breadth", action=CANARY, observation=CANARY)]))
    store.close()


async def _rollout(env: EnvClient, task: Task) -> tuple[Trajectory, dict]:
    """What a trainer does with a served task: start it, act, snapshot the state."""
    created = await env.create(task.env_type, task.env_task_id, params=task.create_params())
    steps = []
    for i, action in enumerate(["get_passenger(passenger_id='P1001')",
                                "search_flight(origin='SFO', destination='JFK')", "All done."]):
        result = await env.step(created.instance_id, action)
        steps.append(Step(index=i, action=ChatMessage(role="assistant", content=action),
                          observation=result.observation, done=result.done))
        if result.done:
            break
    state = (await env.state(created.instance_id)).model_dump()
    await env.release(created.instance_id)
    messages = created.messages + [m for s in steps for m in (s.action, s.observation) if m is not None]
    return Trajectory(task_id=task.task_id, env_type=task.env_type, messages=messages, steps=steps), state


def _judge_with_references(tm_url: str, trajectories: list[Trajectory], original: Trajectory) -> list[str]:
    """Judge the canary task's rollouts (and an original task's, which has no reference) as the trainer does,
    with each judge set-up that fetches references; returns every body the trainer side received."""
    seen: list[str] = []
    batch = [*trajectories, original]
    queries = {t.trajectory_id: "[mode=quote_reference] book a seat" for t in batch}
    with fake_judge_llm() as (llm_url, llm_calls):
        for extra, source in (({"labeller": "reference_rule"}, "rule"), ({"reference": True}, "llm+reference")):
            settings = JudgeSettings(llm={"base_url": llm_url, "model": "fake-judge", "max_retries": 0, "timeout": 20},
                                     task_manager_url=tm_url, audit_log=None, **extra)
            with InProcessServer(create_judge_app(settings)) as judge:
                async def ask(source: str = source) -> None:
                    async with JudgeClient(judge.url) as client:
                        response = await client.judge_trajectories(batch, queries=queries)
                        seen.append(response.model_dump_json())
                        seen.append((await client.stats()).model_dump_json())
                        assert [j.source for j in response.judgments] == [source] * len(trajectories) + ["llm"]

                asyncio.run(ask())
                seen.append(httpx.get(f"{judge.url}/metrics").text)
        # The reference did reach the judge's own LLM (and the fake quoted it back): the judge withheld it.
        assert any(CANARY in json.dumps(call) for call in llm_calls)
    return seen


def test_canary_never_leaves_the_task_manager(flights_env: ServiceProcess, tmp_path: Path) -> None:
    store = tmp_path / "store"
    _plant(store)
    conf = write_conf(tmp_path / "tm.yaml", flights_env.url, store, dedup={"heldout_splits": []})
    seen: list[str] = []  # every response body the trainer side received
    judged: list[Trajectory] = []

    with run_service("task_manager", ["--conf", str(conf), "--log-level", "INFO"]) as tm, \
            run_service("experience_manager", ["--store", str(tmp_path / "em")]) as em:
        async def exercise() -> None:
            async with TaskClient(tm.url) as tasks, EnvClient(flights_env.url) as env, \
                    ExperienceClient(em.url) as experiences:
                job = await tasks.submit_job("flights", episodes=3, seed=5)
                await tasks.wait_job(job.job_id, timeout=120)
                trajectories = []
                for seed in range(12):
                    batch = await tasks.sample_batch_detail(8, synthetic_ratio=1.0, seed=seed)
                    seen.append(batch.model_dump_json())
                    for task in batch.tasks:
                        if task.task_id == TASK_ID and len(trajectories) < 3:
                            trajectory, state = await _rollout(env, task)
                            seen.append(json.dumps(trajectory.model_dump(mode="json")))
                            trajectory.outcome = await tasks.grade(task.task_id, state=state)
                            trajectories.append(trajectory)
                assert trajectories, "the planted task was never sampled"
                judged.extend(trajectories)
                assert trajectories[0].outcome == 0.0
                # A state that matches the reference end state grades 1.0 without revealing it.
                good = await tasks.grade_detail(TASK_ID, state={"comparable": END_STATE})
                assert (good.reward, good.method) == (1.0, "state_match")
                seen.append(good.model_dump_json())
                await tasks.feedback({TASK_ID: [0.0, 1.0]})
                await experiences.create_workspace("canary")
                summary = await experiences.summarize("canary", trajectories, mode="heuristic")
                seen.append(summary.model_dump_json())
                seen.append(json.dumps(await experiences.export("canary")))
                assert not summary.errors, summary.errors

        asyncio.run(exercise())
        original = judged[0].model_copy(update={"trajectory_id": "original-rollout", "task_id": "train-0000"})
        seen += _judge_with_references(tm.url, judged, original)
        with httpx.Client(base_url=tm.url, timeout=30) as http:
            for path in ("/v1/tasks?limit=10000", "/v1/tasks?synthetic=true&limit=10000", f"/v1/tasks/{TASK_ID}",
                         "/v1/stats", "/v1/jobs", "/metrics", "/openapi.json"):
                response = http.get(path)
                assert response.status_code == 200, path
                seen.append(response.text)
            for body in ({"task_id": TASK_ID}, {"task_id": TASK_ID, "trajectory": {"task_id": TASK_ID}},
                         {"task_id": TASK_ID, "state": {"comparable": {"orders": []}}}):
                seen.append(http.post("/v1/grade", json=body).text)
            # The warm start's references are served only with `serve_training_references: true`, never by default.
            refused = http.post("/v1/training_references", json={"env": "flights"})
            assert refused.status_code == 403 and "serve_training_references" in refused.text
            seen.append(refused.text)
            detail = http.get(f"/v1/tasks/{TASK_ID}").json()
            assert detail["pass_rate"] == 0.5 and set(detail["task"]) == set(Task.model_fields)
        log = tm.log()

    assert "kept" in log and "job" in log  # the log did record the job's work
    assert len(seen) > 20
    for text in seen:
        assert CANARY not in text
    assert CANARY not in log
