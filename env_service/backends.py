"""Execution backends: where instance code runs.

`inline`: in the server process, on a small thread pool, so blocking environment code never
stalls the event loop; one hop to a thread costs tens of microseconds per call.
`ray` (env_service/ray_backend.py): a fixed pool of actors, each hosting many instances.
Both raise `HostError` for failures the API maps to HTTP statuses.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from common.schemas import ChatMessage
from env_service.environments.base import Environment, EvalResult, StepResult
from env_service.host import HostError, InstanceHost


class InstanceLostError(HostError):
    """The instance's host died (a Ray actor crash): the instance is gone, other instances are not."""

    def __init__(self, instance_id: str, reason: str) -> None:
        super().__init__(410, "instance_lost", f"instance {instance_id!r} was lost: {reason}; create a new one")


class Backend(ABC):
    name: str

    async def start(self) -> None:  # noqa: B027 (optional hook)
        """Bring the backend up (the server answers /healthz only afterwards)."""

    async def close(self) -> None:  # noqa: B027 (optional hook)
        """Release everything."""

    @abstractmethod
    async def create(self, instance_id: str, env_name: str, task_id: str,
                     params: dict[str, Any]) -> list[ChatMessage]: ...

    @abstractmethod
    async def step(self, instance_id: str, action: ChatMessage) -> StepResult: ...

    @abstractmethod
    async def evaluate(self, instance_id: str, params: dict[str, Any]) -> EvalResult: ...

    @abstractmethod
    async def state(self, instance_id: str) -> dict[str, Any]: ...

    @abstractmethod
    async def fork(self, instance_id: str, new_id: str) -> None:
        """Host `new_id`, a copy of `instance_id` in its current state, where `instance_id` lives."""

    @abstractmethod
    async def release(self, instance_id: str) -> bool: ...

    async def discard(self, instance_id: str) -> None:
        """Drop an instance whose call timed out (its create may still be running)."""
        await self.release(instance_id)

    async def check_health(self) -> dict[str, str]:
        """Instances lost since the last check (id -> reason); hosts that died are replaced."""
        return {}

    def where(self, instance_id: str) -> dict[str, Any] | None:
        """Where an instance runs (for operators and tests); None when the backend has one place."""
        return None

    def stats(self) -> dict[str, Any]:
        return {"backend": self.name}


class InlineBackend(Backend):
    name = "inline"

    def __init__(self, environments: dict[str, Environment], threads: int) -> None:
        self.host = InstanceHost(environments)
        self.threads = threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="env")

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def create(self, instance_id: str, env_name: str, task_id: str,
                     params: dict[str, Any]) -> list[ChatMessage]:
        return await self._run(self.host.create, instance_id, env_name, task_id, params)

    async def step(self, instance_id: str, action: ChatMessage) -> StepResult:
        return await self._run(self.host.step, instance_id, action)

    async def evaluate(self, instance_id: str, params: dict[str, Any]) -> EvalResult:
        return await self._run(self.host.evaluate, instance_id, params)

    async def state(self, instance_id: str) -> dict[str, Any]:
        return await self._run(self.host.state, instance_id)

    async def fork(self, instance_id: str, new_id: str) -> None:
        await self._run(self.host.fork, instance_id, new_id)

    async def release(self, instance_id: str) -> bool:
        return await self._run(self.host.release, instance_id)

    async def discard(self, instance_id: str) -> None:
        await self._run(self.host.discard, instance_id)

    async def close(self) -> None:
        await self._run(self.host.release_all)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict[str, Any]:
        return {"backend": self.name, "threads": self.threads, "hosted": len(self.host.instances)}
