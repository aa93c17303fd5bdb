"""An environment's own failures over real HTTP: an answer JSON cannot carry is never a 500.

A step answer holding a value JSON cannot carry (here a Python set) ends the episode as an environment
error naming the environment and the field, on /v1 and on the AgentEvolver routes; an evaluation
holding one is a 502 naming them; through `remote`, the same reach the client as a failed step and 502.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from env_service.app import build_app
from env_service.settings import EnvServiceSettings
from tests.helpers import InProcessServer

PLUGIN = {"setinfo": "tests.env_service.failing_plugin:SetInfoEnvironment"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[InProcessServer]:
    settings = EnvServiceSettings(environments={"setinfo": {}}, plugins=PLUGIN)
    with InProcessServer(build_app(settings)) as server:
        yield server


@pytest.fixture(scope="module")
def through_remote(upstream: InProcessServer) -> Iterator[InProcessServer]:
    remote = {"url": upstream.url, "env_type": "setinfo", "timeout_s": 10}
    with InProcessServer(build_app(EnvServiceSettings(environments={"remote": remote}))) as server:
        yield server


def create(url: str, env: str) -> str:
    task = httpx.get(f"{url}/v1/environments/{env}/tasks").json()["task_ids"][0]
    answer = httpx.post(f"{url}/v1/instances", json={"env": env, "task_id": task})
    assert answer.status_code == 201, answer.text
    return answer.json()["instance_id"]


def test_a_step_answer_json_cannot_carry_is_a_failed_final_step_naming_env_and_field(upstream):
    instance = create(upstream.url, "setinfo")
    answer = httpx.post(f"{upstream.url}/v1/instances/{instance}/step",
                        json={"action": {"role": "assistant", "content": "look"}})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["done"] is True and body["info"]["error"]["code"] == "environment_error"
    message = body["info"]["error"]["message"]
    assert "environment 'setinfo'" in message and "step.info.seen is a set" in message
    evaluated = httpx.post(f"{upstream.url}/v1/instances/{instance}/evaluate", json={})
    assert evaluated.status_code == 502 and evaluated.json()["error"]["code"] == "environment_output"
    assert "evaluate.info.seen is a set" in evaluated.json()["error"]["message"]


def test_the_agentevolver_step_route_answers_it_the_same_way(upstream):
    task = httpx.get(f"{upstream.url}/v1/environments/setinfo/tasks").json()["task_ids"][0]
    created = httpx.post(f"{upstream.url}/create", json={"env_type": "setinfo", "task_id": task}).json()
    instance = created["data"]["info"]["instance_id"]
    answer = httpx.post(f"{upstream.url}/step", json={"env_type": "setinfo", "instance_id": instance,
                                                       "messages": {"role": "assistant", "content": "look"}})
    assert answer.status_code == 200 and answer.json()["data"]["is_terminated"] is True
    assert "step.info.seen is a set" in answer.json()["data"]["info"]["error"]["message"]


def test_through_remote_the_step_fails_and_the_evaluation_is_a_502(through_remote):
    instance = create(through_remote.url, "remote")
    answer = httpx.post(f"{through_remote.url}/v1/instances/{instance}/step",
                        json={"action": {"role": "assistant", "content": "look"}})
    assert answer.status_code == 200 and answer.json()["info"]["error"]["code"] == "environment_error"
    evaluated = httpx.post(f"{through_remote.url}/v1/instances/{instance}/evaluate", json={})
    assert evaluated.status_code == 502, evaluated.text
    assert "evaluate.info.seen is a set" in evaluated.json()["error"]["message"]
