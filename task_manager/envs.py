"""The task manager's view of the environment service: a thin layer over `env_service.client.EnvClient`.

It adds what exploration, replay and grading need on top of the raw API: an instance as an async
context manager (always released), failure detection on observations, and the *comparable* view
of a state snapshot (generated ids and timestamps left out) that goals are compared on.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from common.schemas import ChatMessage

# An observation that reports a refused call: "Error: ..." (alone, or per call as "[2] f(...) -> Error: ...").
DEFAULT_ERROR_PATTERN = r"(^|\n|-> )\s*(Error|ERROR)\b"
# Keys left out of a state that has no `comparable` view of its own: values that differ between
# two runs of the same actions.
DEFAULT_VOLATILE_KEYS = ("created_at", "updated_at", "timestamp", "time", "instance_id", "task_id")


@dataclass
class StepOutcome:
    observation: str
    done: bool
    failed: bool
    info: dict[str, Any]


def comparable_state(snapshot: Any, volatile_keys: tuple[str, ...] = DEFAULT_VOLATILE_KEYS) -> Any:
    """The part of a state snapshot two runs of the same actions agree on.

    An environment may publish it itself as `snapshot["comparable"]` (flights does); otherwise
    volatile keys are dropped recursively.
    """
    if isinstance(snapshot, dict) and "comparable" in snapshot:
        return snapshot["comparable"]
    return _drop_keys(snapshot, set(volatile_keys))


def _drop_keys(value: Any, keys: set[str]) -> Any:
    if isinstance(value, dict):
        return {k: _drop_keys(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [_drop_keys(v, keys) for v in value]
    return value


class EnvAccess:
    """What the task manager does with environments, over one `EnvClient`."""

    def __init__(self, client: Any, error_pattern: str = DEFAULT_ERROR_PATTERN,
                 volatile_keys: tuple[str, ...] = DEFAULT_VOLATILE_KEYS) -> None:
        self.client = client
        self.error_re = re.compile(error_pattern)
        self.volatile_keys = tuple(volatile_keys)

    def comparable(self, snapshot: Any) -> Any:
        return comparable_state(snapshot, self.volatile_keys)

    def failed(self, observation: str, info: dict[str, Any]) -> bool:
        return bool(info.get("error")) or info.get("success") is False or bool(self.error_re.search(observation))

    async def task_ids(self, env_type: str, split: str) -> list[str]:
        return list(await self.client.task_ids(env_type, split))

    async def profile(self, env_type: str) -> dict[str, Any]:
        return dict(await self.client.profile(env_type))

    async def tool_docs(self, env_type: str, task_id: str | None = None) -> list[dict[str, Any]]:
        return list(await self.client.tool_docs(env_type, task_id))

    @asynccontextmanager
    async def instance(self, env_type: str, task_id: str, query: str | None = None) -> AsyncIterator[Instance]:
        params = {"query": query} if query else {}
        created = await self.client.create(env_type, task_id, params=params)
        instance = Instance(self, created.instance_id, [m.model_dump(exclude_none=True) for m in created.messages])
        try:
            yield instance
        finally:
            try:
                await self.client.release(instance.instance_id)
            except Exception:  # a lost instance is reaped by the env service anyway
                pass


class Instance:
    def __init__(self, access: EnvAccess, instance_id: str, messages: list[dict[str, Any]]) -> None:
        self.access, self.instance_id, self.messages = access, instance_id, messages

    async def step(self, content: str) -> StepOutcome:
        result = await self.access.client.step(self.instance_id, ChatMessage(role="assistant", content=content))
        text = result.observation.text()
        return StepOutcome(text, bool(result.done), self.access.failed(text, dict(result.info)), dict(result.info))

    async def snapshot(self) -> Any:
        """The full state snapshot (None when the environment has no state)."""
        result = await self.access.client.state(self.instance_id)
        return result.state
