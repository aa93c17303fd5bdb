"""Live instances of one process: the inline backend's server process, or one Ray actor.

All methods are synchronous and fast to dispatch; the backends decide which thread or process
runs them. Failures are `HostError`s carrying the HTTP status and code the API should answer.
"""

from __future__ import annotations

import sysconfig
import traceback
from pathlib import Path
from typing import Any

from loguru import logger

from common.schemas import ChatMessage
from env_service.environments.base import EnvInstance, Environment, EvalResult, StepResult


class HostError(Exception):
    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details

    def as_tuple(self) -> tuple[int, str, str, Any]:
        return self.status, self.code, self.message, self.details


class InstanceHost:
    def __init__(self, environments: dict[str, Environment]) -> None:
        self.environments = environments
        self.instances: dict[str, EnvInstance] = {}
        # Ids discarded while their create was still running (a timeout): close them on arrival.
        self._discarded: set[str] = set()

    def create(self, instance_id: str, env_name: str, task_id: str, params: dict[str, Any]) -> list[ChatMessage]:
        env = self.environments[env_name]  # the manager checked the name
        try:
            instance = env.create(task_id, params)
        except KeyError as exc:
            raise HostError(404, "unknown_task", f"environment {env_name!r} has no task {task_id!r} "
                            f"(list them with GET /v1/environments/{env_name}/tasks?split=train)",
                            {"env": env_name, "task_id": task_id, "reason": str(exc)}) from None
        except Exception as exc:  # the environment refused these params: the client's to fix
            raise _rejected(env_name, task_id, "create", exc) from None
        try:
            messages = instance.reset()
            _check_initial_state(env_name, messages)
        except HostError:
            _close_quietly(instance)
            raise
        except Exception as exc:  # e.g. gymnasium refusing a negative seed inside reset()
            _close_quietly(instance)
            raise _rejected(env_name, task_id, "reset", exc) from None
        if instance_id in self._discarded:
            self._discarded.discard(instance_id)
            _close_quietly(instance)
            raise HostError(504, "timeout", f"instance {instance_id!r} was discarded before its create finished")
        self.instances[instance_id] = instance
        return messages

    def step(self, instance_id: str, action: ChatMessage) -> StepResult:
        instance = self._get(instance_id)
        try:
            return instance.step(action)
        except Exception as exc:
            # The contract says a bad action gets an explanatory observation; an environment that
            # raises instead gives a failed, final step (its state is unknown now), not a 500.
            _log_environment_error("step", exc)
            reason = f"{type(exc).__name__}: {exc}{raised_at(exc)}"
            return StepResult(observation=ChatMessage(role="user", content=f"The action failed: {reason}"),
                              done=True, info={"error": {"code": "environment_error", "message": reason}})

    def evaluate(self, instance_id: str, params: dict[str, Any]) -> EvalResult:
        instance = self._get(instance_id)
        try:
            return instance.evaluate(params)
        except HostError:  # a remote server's failure keeps its own status (502/504), not the client's 409
            raise
        except Exception as exc:
            raise _rejected(instance_id, None, "evaluate", exc) from None

    def state(self, instance_id: str) -> dict[str, Any]:
        instance = self._get(instance_id)
        try:
            snapshot = instance.state()
            return {"state": snapshot, "state_hash": instance.state_hash() if snapshot is not None else None}
        except HostError:
            raise
        except Exception as exc:
            raise _rejected(instance_id, None, "state", exc) from None

    def fork(self, instance_id: str, new_id: str) -> None:
        """Host `new_id`, an independent copy of `instance_id` in its current state (the manager checked that
        the environment declares `fork`)."""
        instance = self._get(instance_id)
        try:
            twin = instance.fork()
        except Exception as exc:
            raise _rejected(instance_id, None, "fork", exc) from None
        if twin is instance:
            raise HostError(500, "environment_contract", f"fork of {instance_id!r} returned the instance itself; "
                            "EnvInstance.fork must return an independent copy")
        if new_id in self._discarded:  # the fork timed out meanwhile
            self._discarded.discard(new_id)
            _close_quietly(twin)
            raise HostError(504, "timeout", f"instance {new_id!r} was discarded before its fork finished")
        self.instances[new_id] = twin

    def release(self, instance_id: str) -> bool:
        instance = self.instances.pop(instance_id, None)
        if instance is None:
            return False
        _close_quietly(instance)
        return True

    def discard(self, instance_id: str) -> None:
        """Release now, or as soon as a create still running for this id finishes."""
        if not self.release(instance_id):
            self._discarded.add(instance_id)

    def release_all(self) -> None:
        for instance_id in list(self.instances):
            self.release(instance_id)

    def _get(self, instance_id: str) -> EnvInstance:
        instance = self.instances.get(instance_id)
        if instance is None:
            raise HostError(404, "unknown_instance", f"no live instance {instance_id!r} on this host")
        return instance


def _check_initial_state(env_name: str, messages: list[ChatMessage]) -> None:
    # AgentEvolver's contract, relied on by its clients: exactly [system, user].
    roles = [m.role for m in messages]
    if roles != ["system", "user"]:
        raise HostError(500, "environment_contract", f"environment {env_name!r} reset() returned roles {roles}; "
                        "the contract is exactly [system, user]")


def _rejected(where: str, task_id: str | None, call: str, exc: Exception) -> HostError:
    """An environment's own exception as a 4xx naming what failed; the traceback goes to the log."""
    _log_environment_error(call, exc)
    what = f"{where}/{task_id}" if task_id else where
    return HostError(400 if call in ("create", "reset") else 409, "environment_error",
                     f"{call} of {what} failed in the environment: {type(exc).__name__}: {exc}",
                     {"call": call, "exception": type(exc).__name__})


_LIBRARIES = tuple(str(Path(sysconfig.get_paths()[key]).resolve()) for key in ("purelib", "platlib", "stdlib"))


def raised_at(exc: BaseException) -> str:
    """` (at library_env.py:42 in step)`: the innermost frame of the environment's own code (not a library's)
    that the exception went through; the file's name only, the full traceback is in the service's log."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if not str(Path(f.filename).resolve()).startswith(_LIBRARIES)]
    frame = (own or frames or [None])[-1]
    return f" (at {Path(frame.filename).name}:{frame.lineno} in {frame.name})" if frame else ""


def _log_environment_error(call: str, exc: Exception) -> None:
    logger.opt(exception=exc).warning("environment raised during {}", call)


def _close_quietly(instance: EnvInstance) -> None:
    try:
        instance.close()
    except Exception:  # closing must never fail a release; the instance is gone either way
        logger.opt(exception=True).warning("closing an environment instance failed")
