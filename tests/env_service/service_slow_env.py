"""A test environment whose steps take as long as the action says ("sleep 2.5"): for timeouts.

Loaded by the server through the `plugins` config key, like any operator-supplied environment.
"""

from __future__ import annotations

import time
from typing import Any

from common.schemas import ChatMessage
from env_service.environments.base import EnvInstance, Environment, EvalResult, StepResult


class SlowInstance(EnvInstance):
    def __init__(self) -> None:
        self.steps = 0

    def reset(self) -> list[ChatMessage]:
        return [ChatMessage(role="system", content="slow"), ChatMessage(role="user", content="say 'sleep N'")]

    def step(self, action: ChatMessage) -> StepResult:
        words = action.text().split()
        if len(words) == 2 and words[0] == "sleep":
            time.sleep(float(words[1]))
        self.steps += 1
        return StepResult(observation=ChatMessage(role="user", content=f"step {self.steps}"))

    def evaluate(self, params: dict[str, Any] | None = None) -> EvalResult:
        return EvalResult(score=1.0)


class SlowEnvironment(Environment):
    name = "slow"

    def task_ids(self, split: str) -> list[str]:
        return ["only"]

    def create(self, task_id: str, params: dict[str, Any] | None = None) -> SlowInstance:
        if task_id != "only":
            raise KeyError(task_id)
        return SlowInstance()
