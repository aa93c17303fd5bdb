"""An environment's own exceptions in create, reset, step, evaluate or state: a 4xx or a failed step, never a 500."""

from __future__ import annotations

from typing import Any

import pytest

from common.schemas import ChatMessage
from env_service.environments.base import EnvInstance, Environment, EvalResult, StepResult
from env_service.host import HostError, InstanceHost


class BrittleInstance(EnvInstance):
    """Raises wherever the task id says: a plugin with a bug, as operators load them."""

    def __init__(self, where: str) -> None:
        self.where = where

    def _maybe(self, call: str) -> None:
        if self.where == call:
            raise RuntimeError(f"{call} broke")

    def reset(self) -> list[ChatMessage]:
        self._maybe("reset")
        return [ChatMessage(role="system", content="s"), ChatMessage(role="user", content="u")]

    def step(self, action: ChatMessage) -> StepResult:
        self._maybe("step")
        return StepResult(observation=ChatMessage(role="user", content="ok"))

    def evaluate(self, params: dict[str, Any] | None = None) -> EvalResult:
        self._maybe("evaluate")
        return EvalResult(score=1.0)

    def state(self) -> dict[str, Any] | None:
        self._maybe("state")
        return {"fine": True}


class BrittleEnvironment(Environment):
    name = "brittle"

    def task_ids(self, split: str) -> list[str]:
        return ["create", "reset", "step", "evaluate", "state"]

    def create(self, task_id: str, params: dict[str, Any] | None = None) -> BrittleInstance:
        if task_id == "create":
            raise LookupError("create broke")  # not ValueError/TypeError: those were the only ones mapped
        return BrittleInstance(task_id)


@pytest.fixture()
def host() -> InstanceHost:
    return InstanceHost({"brittle": BrittleEnvironment()})


@pytest.mark.parametrize("task_id", ["create", "reset"])
def test_create_and_reset_failures_are_400s(host, task_id):
    with pytest.raises(HostError) as caught:
        host.create("i1", "brittle", task_id, {})
    assert (caught.value.status, caught.value.code) == (400, "environment_error")
    assert f"{task_id} broke" in caught.value.message and "brittle/" + task_id in caught.value.message
    assert host.instances == {}


def test_a_step_that_raises_is_a_failed_final_step(host):
    host.create("i1", "brittle", "step", {})
    result = host.step("i1", ChatMessage(role="assistant", content="go"))
    assert result.done and result.reward == 0.0
    # The message names where the environment raised, so a user finds the line without the service's log.
    assert result.info["error"] == {"code": "environment_error",
                                    "message": "RuntimeError: step broke (at test_host_errors.py:22 in _maybe)"}
    assert "step broke" in result.observation.text()


@pytest.mark.parametrize("call", ["evaluate", "state"])
def test_evaluate_and_state_failures_are_409s(host, call):
    host.create("i1", "brittle", call, {})
    with pytest.raises(HostError) as caught:
        host.evaluate("i1", {}) if call == "evaluate" else host.state("i1")
    assert (caught.value.status, caught.value.code) == (409, "environment_error")
    assert f"{call} broke" in caught.value.message
