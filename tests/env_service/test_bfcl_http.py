"""Acceptance: BFCL multi-turn through the AgentEvolver routes of a real `python -m env_service`.

Replaying the ground truth of all 800 tasks unchanged (each turn's calls in one message in BFCL's
own format, positional arguments included, then a reply with no call) scores 1.0 on every task; a wrong sequence scores 0.0 with a state-mismatch reason.
The client is aiohttp (installed with ray[default]): for ~9,000 requests httpx's async client
spends about ten times more CPU than the server, on the same two cores.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from env_service.environments.bfcl.data import all_tasks
from tests.env_service.bfcl_ground_truth import NO_CALL, is_positional, turn_message
from tests.helpers import ServiceProcess, run_service

CONCURRENCY = 24


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    conf: Path = tmp_path_factory.mktemp("bfcl") / "env.yaml"
    conf.write_text("env_service:\n  environments:\n    bfcl: {}\n  threads: 4\n")
    with run_service("env_service", ["--conf", str(conf)]) as service:
        yield service


async def call(client: aiohttp.ClientSession, method: str, route: str, body: dict | None = None) -> tuple[int, dict]:
    async with client.request(method, route, data=orjson.dumps(body or {}),
                              headers={"content-type": "application/json"}) as response:
        return response.status, orjson.loads(await response.read())


async def ae(client: aiohttp.ClientSession, route: str, **body) -> dict:
    status, answer = await call(client, "POST", route, body)
    assert status == 200 and answer["success"] is True, (route, status, answer)
    return answer["data"]


def session(url: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(base_url=url, connector=aiohttp.TCPConnector(limit=CONCURRENCY),
                                 timeout=aiohttp.ClientTimeout(total=60))


async def replay_ground_truth(client: aiohttp.ClientSession, task_id: str) -> tuple[float, dict]:
    task = all_tasks()[task_id]
    created = await ae(client, "/create", env_type="bfcl", task_id=task_id, params={})
    assert [m["role"] for m in created["state"]] == ["system", "user"]
    instance_id = created["info"]["instance_id"]
    try:
        for turn in task.ground_truth:
            if turn:
                step = await ae(client, "/step", instance_id=instance_id,
                                messages=turn_message(turn, task.involved_classes))
                assert len(step["state"]) == 1 and not step["is_terminated"]
            step = await ae(client, "/step", instance_id=instance_id, messages=NO_CALL)
            assert len(step["state"]) == 1
        assert step["is_terminated"]
        score = await ae(client, "/evaluate", instance_id=instance_id, params={})
        return score, step["info"]
    finally:
        await ae(client, "/release", instance_id=instance_id)


async def test_all_800_ground_truths_score_one_over_agentevolver_routes(server):
    task_ids = list(all_tasks())
    assert len(task_ids) == 800
    calls = [c for t in all_tasks().values() for turn in t.ground_truth for c in turn]
    assert sum(map(is_positional, calls)) == 160  # sent as BFCL wrote them
    async with session(server.url) as client:
        queue: asyncio.Queue[str] = asyncio.Queue()
        for task_id in task_ids:
            queue.put_nowait(task_id)
        scores: dict[str, tuple[float, dict]] = {}

        async def worker() -> None:
            while not queue.empty():
                task_id = queue.get_nowait()
                scores[task_id] = await replay_ground_truth(client, task_id)

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        stats = (await call(client, "GET", "/v1/instances"))[1]["stats"]
    failures = {tid: info for tid, (score, info) in scores.items() if score != 1.0}
    assert len(scores) == 800 and failures == {}
    assert stats["live"] == 0  # every instance was released


async def test_a_wrong_sequence_scores_zero_with_a_state_mismatch_reason(server):
    task = all_tasks()["multi_turn_base_0"]
    async with session(server.url) as client:
        created = await ae(client, "/create", env_type="bfcl", task_id=task.task_id, params={})
        instance_id = created["info"]["instance_id"]
        # Turn 0 asks to create `temp` and move the report into it; only the cd is done.
        await ae(client, "/step", instance_id=instance_id,
                 messages={"role": "assistant", "content": "[cd(folder='document')]"})
        for _ in task.ground_truth:
            step = await ae(client, "/step", instance_id=instance_id, messages=NO_CALL)
        assert step["is_terminated"] and step["reward"] == 0.0
        assert step["info"]["error_type"] == "multi_turn:instance_state_mismatch"
        assert await ae(client, "/evaluate", instance_id=instance_id, params={}) == 0.0
        _, detailed = await call(client, "POST", f"/v1/instances/{instance_id}/evaluate")
        assert detailed["score"] == 0.0 and detailed["info"]["error_type"] == "multi_turn:instance_state_mismatch"
        _, state = await call(client, "GET", f"/v1/instances/{instance_id}/state")
        assert "temp" not in str(state["state"]["GorillaFileSystem"]["root"]["contents"]["document"])
        await ae(client, "/release", instance_id=instance_id)
