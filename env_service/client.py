"""Clients of the environment service: `EnvClient` (async, typed, /v1) and `HttpGymEnv` (gymnasium).

    async with EnvClient("http://127.0.0.1:8080") as env:
        created = await env.create("flights", "train-0000")
        step = await env.step(created.instance_id, ChatMessage(role="assistant", content="..."))
        score = (await env.evaluate(created.instance_id)).score
        await env.release(created.instance_id)

`HttpGymEnv` is a synchronous `gymnasium.Env` over one remote instance: any gymnasium code can
use any of our environments. Environments that publish native spaces (the `gym` environment)
get them (e.g. Discrete observations and actions); others are Text in, Text out.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import gymnasium
import numpy as np

from common.http import ServiceClient
from common.jsonguard import INT_MAX
from common.schemas import ChatMessage, Split
from env_service.protocol import (
    CreateResponse,
    EnvironmentSummary,
    EvaluateResponse,
    ForkResponse,
    ReleaseResponse,
    StateResponse,
    StepResponse,
    TaskList,
)

T = TypeVar("T")


class EnvClient(ServiceClient):
    """Typed async client of the /v1 API. Errors raise `common.http.ServiceCallError`."""

    async def environments(self) -> list[EnvironmentSummary]:
        body = await self.get("/v1/environments")
        return [EnvironmentSummary.model_validate(e) for e in body["environments"]]

    async def describe(self, env: str) -> dict[str, Any]:
        """`{"name", "info", "task_ids": {split: [ids]}}`."""
        return await self.get(f"/v1/environments/{env}")

    async def task_ids(self, env: str, split: Split = "train") -> list[str]:
        body = await self.get(f"/v1/environments/{env}/tasks", params={"split": split}, model=TaskList)
        return body.task_ids

    async def reference_episode(self, env: str, task_id: str) -> list[ChatMessage]:
        """A train task solved by its reference: [system, user], then each action and its observation."""
        body = await self.get(f"/v1/environments/{env}/tasks/{task_id}/reference")
        return [ChatMessage.model_validate(m) for m in body["messages"]]

    async def profile(self, env: str) -> dict[str, Any]:
        return await self.get(f"/v1/environments/{env}/profile")

    async def tool_docs(self, env: str, task_id: str | None = None) -> list[dict[str, Any]]:
        params = {"task_id": task_id} if task_id else None
        return (await self.get(f"/v1/environments/{env}/tools", params=params))["tools"]

    async def create(self, env: str, task_id: str, params: dict[str, Any] | None = None,
                     instance_id: str | None = None) -> CreateResponse:
        body: dict[str, Any] = {"env": env, "task_id": task_id, "params": params or {}}
        if instance_id:
            body["instance_id"] = instance_id
        # Retrying a create is safe only with a caller-chosen id (a duplicate then answers 409).
        return await self.post("/v1/instances", json=body, model=CreateResponse, idempotent=instance_id is not None)

    async def step(self, instance_id: str, action: ChatMessage | str) -> StepResponse:
        if isinstance(action, str):
            action = ChatMessage(role="assistant", content=action)
        return await self.post(f"/v1/instances/{instance_id}/step",
                               json={"action": action.model_dump(exclude_none=True)}, model=StepResponse)

    async def evaluate(self, instance_id: str, params: dict[str, Any] | None = None) -> EvaluateResponse:
        return await self.post(f"/v1/instances/{instance_id}/evaluate", json={"params": params or {}},
                               model=EvaluateResponse, idempotent=True)

    async def state(self, instance_id: str) -> StateResponse:
        return await self.get(f"/v1/instances/{instance_id}/state", model=StateResponse)

    async def fork(self, instance_id: str, new_instance_id: str | None = None) -> ForkResponse:
        """An independent copy of the instance in its current state (environments that declare `fork`)."""
        body = {"instance_id": new_instance_id} if new_instance_id else {}
        # Retrying is safe only with a caller-chosen id (a duplicate then answers 409), as for create.
        return await self.post(f"/v1/instances/{instance_id}/fork", json=body, model=ForkResponse,
                               idempotent=new_instance_id is not None)

    async def capabilities(self, env: str) -> dict[str, bool]:
        """What the environment declares beyond the protocol (`fork`, `deterministic`); all false for a server
        that does not say."""
        info = (await self.describe(env)).get("info") or {}
        declared = info.get("capabilities") or {}
        return {"fork": bool(declared.get("fork")), "deterministic": bool(declared.get("deterministic"))}

    async def release(self, instance_id: str) -> bool:
        return (await self.delete(f"/v1/instances/{instance_id}", model=ReleaseResponse)).released

    async def instances(self) -> dict[str, Any]:
        """`{"stats": {...}, "instances": [...]}`: what is live on the server."""
        return await self.get("/v1/instances")


class _LoopThread:
    """A private event loop on a daemon thread, so sync code can call the async client from anywhere
    (including from inside another running event loop)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="HttpGymEnv-loop", daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)
        self.loop.close()


def _space(spec: dict[str, Any]) -> gymnasium.Space | None:
    if spec.get("type") == "Discrete":
        return gymnasium.spaces.Discrete(int(spec["n"]), start=int(spec.get("start", 0)))
    return None


class HttpGymEnv(gymnasium.Env):
    """A gymnasium.Env backed by a remote env-service instance (one per episode).

    `reset(seed=...)` releases the previous instance and creates a new one for `task_id`, passing the
    seed as `params.seed`; without a seed one is drawn from `self.np_random`, so a seeded sequence
    of episodes is reproducible. Actions: an int (native Discrete spaces) or the assistant's text.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, base_url: str, env: str, task_id: str, *, render_mode: str | None = None,
                 params: dict[str, Any] | None = None, timeout: float = 60.0) -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.render_mode = render_mode
        self.env_name, self.task_id, self.params = env, task_id, dict(params or {})
        self._runner = _LoopThread()
        self._client = EnvClient(base_url, timeout=timeout, retries=1, max_connections=4)
        self._instance: str | None = None
        self._text = ""
        description = self._runner.run(self._client.describe(env))
        game = task_id.rpartition("/")[0]
        spaces = (description.get("info") or {}).get("spaces", {}).get(game, {})
        observation, action = _space(spaces.get("observation", {})), _space(spaces.get("action", {}))
        self.native = observation is not None and action is not None
        self.action_names: list[str] = list(spaces.get("action", {}).get("names", []))
        self.observation_space = observation if self.native else gymnasium.spaces.Text(1_000_000)
        self.action_space = action if self.native else gymnasium.spaces.Text(100_000)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        if seed is not None and not 0 <= seed <= INT_MAX:  # the server could not carry it back (JSON rule)
            raise ValueError(f"seed must be in [0, {INT_MAX}], got {seed}")
        super().reset(seed=seed)
        episode_seed = seed if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        self._release()
        params = {**self.params, **(options or {}).get("params", {})}
        if self.native:
            params["seed"] = episode_seed
        created = self._runner.run(self._client.create(self.env_name, self.task_id, params))
        self._instance = created.instance_id
        self._text = created.messages[-1].text()
        if self.native:
            state = self._runner.run(self._client.state(created.instance_id))
            return self._observation(state.state["observation"]), {"text": self._text}
        return self._text, {"messages": [m.model_dump(exclude_none=True) for m in created.messages]}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        if self._instance is None:
            raise RuntimeError("call reset() before step()")
        content = str(int(action)) if self.native else str(action)
        result = self._runner.run(self._client.step(self._instance, content))
        self._text = result.observation.text()
        info = dict(result.info)
        if self.native:
            observation = self._observation(info.pop("observation"))
            terminated, truncated = bool(info.pop("terminated")), bool(info.pop("truncated"))
            info.pop("action", None)
            return observation, float(result.reward), terminated, truncated, {**info.pop("gym_info", {}),
                                                                              "text": self._text, **info}
        return self._text, float(result.reward), bool(result.done), False, info

    def _observation(self, value: Any) -> Any:
        return np.int64(value) if isinstance(self.observation_space, gymnasium.spaces.Discrete) else value

    def evaluate(self) -> float:
        if self._instance is None:
            raise RuntimeError("no episode to evaluate: call reset() first")
        return self._runner.run(self._client.evaluate(self._instance)).score

    def render(self) -> str | None:
        return self._text if self.render_mode == "ansi" else None

    def _release(self) -> None:
        if self._instance is not None:
            instance, self._instance = self._instance, None
            self._runner.run(self._client.release(instance))

    def close(self) -> None:
        if getattr(self, "_runner", None) is None:
            return
        try:
            self._release()
            self._runner.run(self._client.aclose())
        finally:
            self._runner.stop()
            self._runner = None  # type: ignore[assignment]
        super().close()
