"""The `remote` environment against a real env server over HTTP, speaking /v1 or AgentEvolver's routes."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from common.schemas import ChatMessage
from env_service.environments.bfcl.data import all_tasks
from env_service.environments.remote import RemoteEnvironment
from env_service.host import HostError
from tests.env_service.bfcl_ground_truth import NO_CALL, turn_message
from tests.helpers import ServiceProcess, free_port, run_service

PROTOCOLS = ("v1", "agentevolver")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    conf = tmp_path_factory.mktemp("remote") / "env.yaml"
    conf.write_text("env_service:\n  environments:\n    bfcl: {categories: [base]}\n    gym: {}\n")
    with run_service("env_service", ["--conf", str(conf)]) as service:
        yield service


def remote(upstream: ServiceProcess, protocol: str, env_type: str = "bfcl") -> RemoteEnvironment:
    return RemoteEnvironment({"url": upstream.url, "protocol": protocol, "env_type": env_type, "timeout_s": 30})


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bfcl_ground_truth_through_remote_scores_one(upstream, protocol):
    env = remote(upstream, protocol)
    assert len(env.task_ids("train")) + len(env.task_ids("validation")) + len(env.task_ids("test")) == 200
    instance = env.create("multi_turn_base_3")
    messages = instance.reset()
    assert [m.role for m in messages] == ["system", "user"]
    task = all_tasks()["multi_turn_base_3"]
    for turn in task.ground_truth:
        if turn:
            instance.step(ChatMessage.model_validate(turn_message(turn, task.involved_classes)))
        last = instance.step(ChatMessage.model_validate(NO_CALL))
    assert last.done and last.reward == 1.0
    assert instance.evaluate().score == 1.0
    snapshot = instance.state()
    if protocol == "v1":  # /v1 forwards the verifiable state; AgentEvolver's protocol has none
        assert set(snapshot) == set(task.involved_classes)
    else:
        assert snapshot is None
    tools = env.tool_docs("multi_turn_base_3")
    assert any(t["function"]["name"] == "cd" for t in tools)
    instance.close()
    instance.close()  # twice is harmless


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_close_releases_the_upstream_instance(upstream, protocol):
    env = remote(upstream, protocol, "gym")
    task_id = env.task_ids("train")[0]
    before = httpx.get(f"{upstream.url}/v1/instances").json()["stats"]["live"]
    instance = env.create(task_id)
    instance.reset()
    assert httpx.get(f"{upstream.url}/v1/instances").json()["stats"]["live"] == before + 1
    instance.close()
    assert httpx.get(f"{upstream.url}/v1/instances").json()["stats"]["live"] == before


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_instance_released_upstream_is_reported_lost(upstream, protocol):
    env = remote(upstream, protocol, "gym")
    instance = env.create(env.task_ids("train")[0])
    instance.reset()
    httpx.delete(f"{upstream.url}/v1/instances/{instance.remote_id}")
    with pytest.raises(HostError) as lost:
        instance.step(ChatMessage(role="assistant", content="left"))
    assert lost.value.status == 410 and instance.remote_id in lost.value.message


def test_unknown_task_is_a_key_error_and_replaced_query_is_forwarded(upstream):
    env = remote(upstream, "v1")
    with pytest.raises(KeyError, match="no task 'multi_turn_base_9999'"):
        env.create("multi_turn_base_9999")
    instance = env.create("multi_turn_base_0", {"query": "Make a folder named x."})
    assert instance.reset()[1].content == "Make a folder named x."
    instance.close()


def test_unreachable_remote_and_bad_config_give_clear_errors():
    env = RemoteEnvironment({"url": f"http://127.0.0.1:{free_port()}", "env_type": "bfcl", "timeout_s": 2})
    with pytest.raises(HostError) as unreachable:
        env.task_ids("train")
    assert unreachable.value.status == 502 and "did not answer" in unreachable.value.message
    with pytest.raises(ValueError, match="url must start with http"):
        RemoteEnvironment({"url": "127.0.0.1:80", "env_type": "bfcl"})
    with pytest.raises(ValueError, match="env_type"):
        RemoteEnvironment({"url": "http://127.0.0.1:80"})
    with pytest.raises(ValueError, match="protocol"):
        RemoteEnvironment({"url": "http://127.0.0.1:80", "env_type": "x", "protocol": "grpc"})
    with pytest.raises(ValueError, match="NO_SUCH_TOKEN_VAR"):
        RemoteEnvironment({"url": "http://127.0.0.1:80", "env_type": "x", "api_token_env": "NO_SUCH_TOKEN_VAR"})


def test_remote_unknown_environment_surfaces_the_remote_message(upstream):
    env = RemoteEnvironment({"url": upstream.url, "protocol": "agentevolver", "env_type": "nope"})
    with pytest.raises(HostError) as error:
        env.task_ids("train")
    assert error.value.status == 502 and "unknown environment 'nope'" in error.value.message


def test_a_third_party_agentevolver_server_plugs_in():
    """An AgentEvolver-style server that is not ours (free-text tool info, no state) works as `remote`."""
    with run_service("tests.env_service.conformance_faulty_server", ["--fault", "none"]) as other:
        env = RemoteEnvironment({"url": other.url, "protocol": "agentevolver", "env_type": "counter"})
        assert env.task_ids("train") == ["c0", "c1", "c2"]
        assert env.tool_docs("c0") == []  # its /get_info is free text, not tool schemas
        instance = env.create("c1")
        assert [m.content for m in instance.reset()] == ["Count to three.", "Start."]
        results = [instance.step(ChatMessage(role="assistant", content="one")) for _ in range(3)]
        assert [r.done for r in results] == [False, False, True]
        assert results[-1].observation.content == "count=3"
        assert instance.evaluate().score == 1.0 and instance.state() is None
        instance.close()
        assert httpx.get(f"{other.url}/v1/instances").json()["stats"]["live"] == 0
