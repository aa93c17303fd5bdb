"""Environments that fail on their side (not the policy's): plugins for the environment-error tests.

- `CrashingEnvironment`: every step raises, as an environment with a broken backend would.
- `SetInfoEnvironment`: every step and evaluation answers an `info` holding a Python set, which JSON
  cannot carry.
Both are the signal environment otherwise (its tasks, its reset).
"""

from __future__ import annotations

from typing import Any

from common.schemas import ChatMessage
from env_service.environments.base import EvalResult, StepResult
from env_service.environments.signal import SignalEnvironment, SignalInstance

CRASH = "the inventory database is locked"


class CrashingInstance(SignalInstance):
    def step(self, action: ChatMessage) -> StepResult:
        raise RuntimeError(CRASH)


class SetInfoInstance(SignalInstance):
    def step(self, action: ChatMessage) -> StepResult:
        result = super().step(action)
        return StepResult(observation=result.observation, done=result.done, info={"seen": {"north", "south"}})

    def evaluate(self, params: dict[str, Any] | None = None) -> EvalResult:
        return EvalResult(score=0.0, info={"seen": {"north"}})


class CrashingEnvironment(SignalEnvironment):
    def create(self, task_id: str, params: dict[str, Any] | None = None) -> SignalInstance:
        if task_id not in self._tasks:
            raise KeyError(task_id)
        return CrashingInstance(self.settings, self._tasks[task_id], (params or {}).get("query"))


class SetInfoEnvironment(SignalEnvironment):
    def create(self, task_id: str, params: dict[str, Any] | None = None) -> SignalInstance:
        if task_id not in self._tasks:
            raise KeyError(task_id)
        return SetInfoInstance(self.settings, self._tasks[task_id], (params or {}).get("query"))
