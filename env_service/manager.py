"""The instance manager: ids, the cap, per-call timeouts, idle reaping and clear 404s (410s for lost instances).

It is backend-agnostic: it keeps one small record per live instance in the server process and
delegates the environment work to the backend. Calls on one instance are serialized (environment
instances are not thread-safe); calls on different instances run concurrently.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from common.jsonguard import unsendable
from common.schemas import ChatMessage
from common.service import ServiceError
from env_service.backends import Backend, InstanceLostError
from env_service.environments.base import Environment, EvalResult, StepResult
from env_service.host import HostError

_TOMBSTONES = 10_000  # recently ended instances remembered, so a late call learns why it is gone


@dataclass(frozen=True)
class _Ended:
    """What a later call on an ended instance is answered: 404 `unknown_instance` saying why it is gone (released,
    reaped, timed out), or 410 `instance_lost` when it died with its worker, whether a call or the health check
    found that out first: a client recollects an episode on a 410 alone."""

    status: int
    code: str
    message: str

    @classmethod
    def gone(cls, instance_id: str, why: str) -> _Ended:
        return cls(404, "unknown_instance", f"instance {instance_id!r} is gone: {why}")

    @classmethod
    def lost(cls, error: HostError) -> _Ended:
        return cls(error.status, error.code, error.message)


@dataclass(eq=False)
class InstanceRecord:
    instance_id: str
    env: str
    task_id: str
    created_at: float
    last_used: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    steps: int = 0

    def describe(self, now: float) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "env": self.env, "task_id": self.task_id,
                "age_s": round(now - self.created_at, 3), "idle_s": round(now - self.last_used, 3),
                "steps": self.steps}


class InstanceManager:
    def __init__(self, backend: Backend, environments: dict[str, Environment], *, max_instances: int,
                 ttl_s: float, call_timeout_s: float, create_timeout_s: float, retry_after_s: int) -> None:
        self.backend, self.environments = backend, environments
        self.max_instances, self.ttl_s = max_instances, ttl_s
        self.call_timeout_s, self.create_timeout_s = call_timeout_s, create_timeout_s
        self.retry_after_s = retry_after_s
        self.records: dict[str, InstanceRecord] = {}
        self._creating: set[str] = set()
        self._ended: OrderedDict[str, _Ended] = OrderedDict()
        self.reaped = 0
        self._background: set[asyncio.Task] = set()

    # ------------------------------------------------------------ lookups

    def environment(self, name: str) -> Environment:
        env = self.environments.get(name)
        if env is None:
            raise ServiceError(404, "unknown_environment",
                               f"unknown environment {name!r}; this server serves: {', '.join(self.environments)}",
                               {"known": list(self.environments)})
        return env

    def record(self, instance_id: str) -> InstanceRecord:
        record = self.records.get(instance_id)
        if record is None:
            ended = self._ended.get(instance_id)
            if ended is not None:
                raise ServiceError(ended.status, ended.code, ended.message, {"instance_id": instance_id})
            raise ServiceError(404, "unknown_instance", f"unknown instance {instance_id!r}: it was never created "
                               "here (or the server restarted)", {"instance_id": instance_id})
        return record

    def live(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [r.describe(now) for r in self.records.values()]

    # ------------------------------------------------------------ lifecycle

    async def create(self, env_name: str, task_id: str, params: dict[str, Any] | None = None,
                     instance_id: str | None = None) -> tuple[InstanceRecord, list[ChatMessage]]:
        self.environment(env_name)
        instance_id = self._reserve(instance_id)
        try:
            messages = await self._bounded(self.backend.create(instance_id, env_name, task_id, dict(params or {})),
                                           self.create_timeout_s, instance_id, "create")
            if problem := _not_json(env_name, "create", [m.model_dump(exclude_none=True) for m in messages]):
                await self.backend.release(instance_id)
                raise ServiceError(502, "environment_output", problem, {"env": env_name, "call": "create"})
            now = time.monotonic()
            record = InstanceRecord(instance_id, env_name, task_id, now, now)
            self.records[instance_id] = record
            self._ended.pop(instance_id, None)
            return record, messages
        finally:
            self._creating.discard(instance_id)

    async def step(self, instance_id: str, action: ChatMessage) -> StepResult:
        record = self.record(instance_id)
        async with record.lock:
            result = await self._call(record, self.backend.step(instance_id, action), "step")
            record.steps += 1
            return _sendable_step(record.env, result)

    async def evaluate(self, instance_id: str, params: dict[str, Any] | None = None) -> EvalResult:
        record = self.record(instance_id)
        async with record.lock:
            result = await self._call(record, self.backend.evaluate(instance_id, dict(params or {})), "evaluate")
        _check_json(record.env, "evaluate", {"info": result.info})
        return result

    async def state(self, instance_id: str) -> dict[str, Any]:
        record = self.record(instance_id)
        async with record.lock:
            snapshot = await self._call(record, self.backend.state(instance_id), "state")
        _check_json(record.env, "state", snapshot)
        return snapshot

    async def fork(self, instance_id: str, new_id: str | None = None) -> InstanceRecord:
        """A new instance, an independent copy of `instance_id` in its current state (steps count on from it).

        409 `fork_unsupported` names the environment when it does not declare the `fork` capability."""
        record = self.record(instance_id)
        capabilities = self.environment(record.env).capabilities()
        if not capabilities.get("fork"):
            raise ServiceError(409, "fork_unsupported", f"environment {record.env!r} cannot fork instance "
                               f"{instance_id!r}: it does not copy its state (its capabilities: "
                               f"{_declared(capabilities)}); replay the actions on a fresh instance instead, "
                               "where the environment is deterministic",
                               {"env": record.env, "capabilities": capabilities})
        new_id = self._reserve(new_id)
        try:
            async with record.lock:  # the copy is of a state no step is changing
                try:
                    await self._call(record, self.backend.fork(instance_id, new_id), "fork")
                except ServiceError as exc:
                    if exc.code == "timeout":  # the copy may still appear on its host: drop it when it does
                        await self._discard(new_id)
                    raise
            now = time.monotonic()
            twin = InstanceRecord(new_id, record.env, record.task_id, now, now, steps=record.steps)
            self.records[new_id] = twin
            self._ended.pop(new_id, None)
            return twin
        finally:
            self._creating.discard(new_id)

    def _reserve(self, instance_id: str | None) -> str:
        """A fresh id (or the caller's), counted against the cap until its instance exists."""
        if instance_id is not None and (instance_id in self.records or instance_id in self._creating):
            raise ServiceError(409, "instance_exists", f"instance {instance_id!r} already exists; "
                               "release it first or omit instance_id to get a fresh one")
        if len(self.records) + len(self._creating) >= self.max_instances:
            raise ServiceError(429, "too_many_instances",
                               f"the server hosts its maximum of {self.max_instances} live instances; "
                               "release finished ones or retry later",
                               {"max_instances": self.max_instances}, {"Retry-After": str(self.retry_after_s)})
        instance_id = instance_id or f"inst_{uuid.uuid4().hex[:20]}"
        self._creating.add(instance_id)
        return instance_id

    async def release(self, instance_id: str, reason: str = "it was released") -> bool:
        """Release an instance; False when it was not live (releasing twice is harmless)."""
        record = self.records.pop(instance_id, None)
        if record is None:
            return False
        self._remember_end(instance_id, _Ended.gone(instance_id, reason))
        try:
            async with record.lock:  # let an in-flight call finish first
                await self.backend.release(instance_id)
        except HostError as exc:
            logger.warning("release of {}: {}", instance_id, exc.message)
        return True

    async def close(self) -> None:
        self.records.clear()
        await self.backend.close()

    # ------------------------------------------------------------ reaping and health

    async def reap_idle(self) -> list[str]:
        cutoff = time.monotonic() - self.ttl_s
        idle = [r.instance_id for r in self.records.values() if r.last_used < cutoff and not r.lock.locked()]
        for instance_id in idle:
            await self.release(instance_id, f"it was reaped after {self.ttl_s:g}s idle")
        self.reaped += len(idle)
        if idle:
            logger.info("reaped {} idle instances", len(idle))
        return idle

    async def check_health(self) -> None:
        for instance_id, reason in (await self.backend.check_health()).items():
            self._forget(instance_id, _Ended.lost(InstanceLostError(instance_id, reason)))

    async def maintenance_loop(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.check_health()
                await self.reap_idle()
            except Exception:  # keep the loop alive; the next round retries
                logger.opt(exception=True).error("instance maintenance failed")

    # ------------------------------------------------------------ internals

    async def _call(self, record: InstanceRecord, call: Any, what: str) -> Any:
        record.last_used = time.monotonic()
        try:
            return await self._bounded(call, self.call_timeout_s, record.instance_id, what)
        finally:
            record.last_used = time.monotonic()

    async def _bounded(self, call: Any, timeout: float, instance_id: str, what: str) -> Any:
        try:
            async with asyncio.timeout(timeout):
                return await call
        except TimeoutError:
            # The call may still be running on its thread/actor; the instance is unusable now.
            self._forget(instance_id, _Ended.gone(instance_id, f"its {what} call exceeded the {timeout:g}s timeout"))
            task = asyncio.get_running_loop().create_task(self._discard(instance_id))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            raise ServiceError(504, "timeout", f"{what} on instance {instance_id!r} exceeded the {timeout:g}s "
                               "timeout; the instance was discarded", {"instance_id": instance_id}) from None
        except HostError as exc:
            if exc.code == "instance_lost":
                self._forget(instance_id, _Ended.lost(exc))
            raise ServiceError(exc.status, exc.code, exc.message, exc.details) from None

    async def _discard(self, instance_id: str) -> None:
        try:
            await self.backend.discard(instance_id)
        except Exception:
            logger.opt(exception=True).warning("discarding timed-out instance {} failed", instance_id)

    def _forget(self, instance_id: str, ended: _Ended) -> None:
        if self.records.pop(instance_id, None) is not None or instance_id not in self._ended:
            self._remember_end(instance_id, ended)

    def _remember_end(self, instance_id: str, ended: _Ended) -> None:
        self._ended[instance_id] = ended
        self._ended.move_to_end(instance_id)
        while len(self._ended) > _TOMBSTONES:
            self._ended.popitem(last=False)

    def stats(self) -> dict[str, Any]:
        return {"live": len(self.records), "creating": len(self._creating), "max_instances": self.max_instances,
                "ttl_s": self.ttl_s, "reaped": self.reaped, **self.backend.stats()}


def _declared(capabilities: dict[str, bool]) -> str:
    named = [name for name, on in capabilities.items() if on]
    return ", ".join(named) if named else "none"


def _not_json(env: str, call: str, value: Any) -> str | None:
    """What in an environment's answer JSON cannot carry (a set, a lone surrogate...), naming env and field."""
    problem = unsendable(value, call)
    if problem is None:
        return None
    where, why = problem
    return f"environment {env!r} answered {call} with a value JSON cannot carry: {where} is {why}"


def _check_json(env: str, call: str, value: Any) -> None:
    if problem := _not_json(env, call, value):
        raise ServiceError(502, "environment_output", problem, {"env": env, "call": call})


def _sendable_step(env: str, result: StepResult) -> StepResult:
    """A step answer JSON cannot carry ends the episode as an environment error (its state is unknown now)."""
    problem = _not_json(env, "step", {"observation": result.observation.model_dump(exclude_none=True),
                                      "info": result.info})
    if problem is None:
        return result
    logger.warning(problem)
    return StepResult(observation=ChatMessage(role="user", content=f"The action failed: {problem}"), done=True,
                      info={"error": {"code": "environment_error", "message": problem}})
