"""The two env-server APIs as the kit sees them: every answer is validated against the protocol.

A protocol violation raises `Violation(check, message)`; `check` names the conformance check that
fails (for example `ae.step_shape`), so one bad field is reported where it belongs.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import httpx

ROLES = {"system", "user", "assistant", "tool"}


class Violation(Exception):
    def __init__(self, check: str, message: str) -> None:
        super().__init__(message)
        self.check, self.message = check, message


@dataclass
class Answer:
    status: int
    body: Any
    seconds: float


@dataclass
class Transport:
    """An HTTP client that turns every call over the time limit into a `timeouts` violation."""

    client: httpx.AsyncClient
    timeout_s: float
    slow_calls: list[str] = field(default_factory=list)

    async def call(self, method: str, path: str, what: str, **kwargs: Any) -> Answer:
        started = time.monotonic()
        try:
            response = await self.client.request(method, path, timeout=self.timeout_s, **kwargs)
        except httpx.TimeoutException:
            self.slow_calls.append(f"{what} ({method} {path}) gave no answer within {self.timeout_s:g}s")
            raise Violation("timeouts", self.slow_calls[-1]) from None
        except httpx.HTTPError as exc:
            raise Violation("transport", f"{what} ({method} {path}) failed: {exc!r}") from None
        try:
            body = response.json()
        except ValueError:
            body = response.text
        return Answer(response.status_code, body, time.monotonic() - started)


def check_message(message: Any, check: str, where: str) -> None:
    if not isinstance(message, dict):
        raise Violation(check, f"{where}: a message must be an object, got {type(message).__name__}")
    if message.get("role") not in ROLES:
        raise Violation(check, f"{where}: message role {message.get('role')!r} is not one of {sorted(ROLES)}")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise Violation(check, f"{where}: message content must be a string, got {type(content).__name__}")


def check_opening(messages: list[Any], check: str, where: str) -> None:
    """The messages a create answers: well-formed, and exactly a system prompt then the first user turn."""
    for i, message in enumerate(messages):
        check_message(message, check, f"{where}[{i}]")
    roles = [m["role"] for m in messages]
    if roles != ["system", "user"]:
        raise Violation(check, f"{where} must be exactly [system, user], got roles {roles}")


def check_number(value: Any, check: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Violation(check, f"{where} must be a number, got {value!r}")
    return float(value)


@dataclass
class Step:
    observation: dict[str, Any]
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)

    def environment_error(self) -> str | None:
        """The environment's own failure this step reported (`info.error.code == "environment_error"`): the
        server caught an exception, or an answer JSON cannot carry, and ended the episode. Training meets
        the same step as a failed rollout, so it is no pass here, however well-formed the answer."""
        error = self.info.get("error")
        if isinstance(error, dict) and error.get("code") == "environment_error":
            return str(error.get("message") or "no message")
        return None


class Api(ABC):
    """One API of an env server, for one environment."""

    prefix: str

    def __init__(self, transport: Transport, env: str) -> None:
        self.transport, self.env = transport, env

    def _expect(self, answer: Answer, check: str, what: str, statuses: tuple[int, ...] = (200,)) -> Any:
        if answer.status not in statuses:
            raise Violation(check, f"{what} answered HTTP {answer.status}: {str(answer.body)[:300]}")
        return answer.body

    @abstractmethod
    async def offered(self) -> bool: ...

    @abstractmethod
    async def task_ids(self, split: str) -> list[str]: ...

    @abstractmethod
    async def tools(self, task_id: str) -> list[dict[str, Any]]: ...

    @abstractmethod
    async def create(self, task_id: str, params: dict[str, Any] | None = None) -> tuple[str, list[dict[str, Any]]]:
        """A new instance; `params["query"]` (a synthetic task's question) must replace the task's user query."""

    @abstractmethod
    async def step(self, instance_id: str, action: dict[str, Any]) -> Step: ...

    @abstractmethod
    async def evaluate(self, instance_id: str) -> float: ...

    @abstractmethod
    async def release(self, instance_id: str) -> Answer: ...

    @abstractmethod
    def is_not_found(self, answer: Answer) -> str | None:
        """None when `answer` is this API's 'no such instance' error, else what is wrong with it."""

    @abstractmethod
    async def create_raw(self, env: str, task_id: str, params: dict[str, Any] | None = None) -> Answer: ...

    @abstractmethod
    async def step_raw(self, instance_id: str, action: Any) -> Answer: ...

    @abstractmethod
    async def evaluate_raw(self, instance_id: str) -> Answer: ...

    @abstractmethod
    async def malformed_create(self) -> Answer: ...

    def is_error_shape(self, answer: Answer) -> str | None:
        """None when `answer` is a well-formed client error of this API, else what is wrong with it."""
        if not 400 <= answer.status < 500:
            return f"expected a 4xx error, got HTTP {answer.status}"
        return None


class AgentEvolverApi(Api):
    """AgentEvolver's routes: `{"success": bool, "data": ...}`, errors as `success: false`."""

    prefix = "ae"

    async def _post(self, path: str, what: str, **body: Any) -> Answer:
        return await self.transport.call("POST", path, what, json=body)

    def _data(self, answer: Answer, check: str, what: str) -> Any:
        body = self._expect(answer, check, what)
        if not isinstance(body, dict) or body.get("success") is not True or "data" not in body:
            raise Violation(check, f"{what} must answer {{\"success\": true, \"data\": ...}}, got {str(body)[:300]}")
        return body["data"]

    async def offered(self) -> bool:
        answer = await self._post("/get_env_profile", "get_env_profile", env_type=self.env, params={"split": "train"})
        return answer.status not in (404, 405) or (isinstance(answer.body, dict) and "success" in answer.body)

    async def task_ids(self, split: str) -> list[str]:
        answer = await self._post("/get_env_profile", "get_env_profile", env_type=self.env, params={"split": split})
        data = self._data(answer, "ae.profile", f"get_env_profile(split={split})")
        if not isinstance(data, list) or not all(isinstance(t, str) for t in data):
            raise Violation("ae.profile", f"get_env_profile must list task ids (strings), got {str(data)[:200]}")
        return data

    async def tools(self, task_id: str) -> list[dict[str, Any]]:
        answer = await self._post("/get_info", "get_info", env_type=self.env, task_id=task_id)
        if answer.status != 200 or not isinstance(answer.body, dict):
            return []
        data = answer.body.get("data")
        try:
            tools = json.loads(data) if isinstance(data, str) else data
        except ValueError:
            return []  # AgentEvolver answers free text here; the agent then acts with words
        return tools if isinstance(tools, list) else []

    async def create_raw(self, env: str, task_id: str, params: dict[str, Any] | None = None) -> Answer:
        return await self._post("/create", "create", env_type=env, task_id=task_id, params=params or {})

    async def create(self, task_id: str, params: dict[str, Any] | None = None) -> tuple[str, list[dict[str, Any]]]:
        data = self._data(await self.create_raw(self.env, task_id, params), "ae.create_shape", f"create({task_id})")
        if not isinstance(data, dict) or not isinstance(data.get("state"), list) or not isinstance(data.get("info"), dict):
            raise Violation("ae.create_shape", f"create data must be {{state: [...], info: {{...}}}}, got {str(data)[:300]}")
        instance_id = data["info"].get("instance_id")
        if not isinstance(instance_id, str) or not instance_id:
            raise Violation("ae.create_shape", f"create data.info must carry the instance_id, got {data['info']}")
        check_opening(data["state"], "ae.create_shape", "create state")
        return instance_id, data["state"]

    async def step_raw(self, instance_id: str, action: Any) -> Answer:
        return await self._post("/step", "step", instance_id=instance_id, messages=action)

    async def step(self, instance_id: str, action: dict[str, Any]) -> Step:
        data = self._data(await self.step_raw(instance_id, action), "ae.step_shape", "step")
        if not isinstance(data, dict) or not isinstance(data.get("state"), list):
            raise Violation("ae.step_shape", f"step data must hold state: [message], got {str(data)[:300]}")
        if len(data["state"]) != 1:
            raise Violation("ae.step_shape", f"step state must be exactly one message, got {len(data['state'])}")
        check_message(data["state"][0], "ae.step_shape", "step state[0]")
        reward = check_number(data.get("reward"), "ae.step_shape", "step reward")
        if not isinstance(data.get("is_terminated"), bool):
            raise Violation("ae.step_shape", f"step is_terminated must be a boolean, got {data.get('is_terminated')!r}")
        if not isinstance(data.get("info", {}), dict):
            raise Violation("ae.step_shape", "step info must be an object")
        return Step(data["state"][0], reward, data["is_terminated"], data.get("info") or {})

    async def evaluate_raw(self, instance_id: str) -> Answer:
        return await self._post("/evaluate", "evaluate", instance_id=instance_id, params={})

    async def evaluate(self, instance_id: str) -> float:
        data = self._data(await self.evaluate_raw(instance_id), "ae.evaluate_range", "evaluate")
        return check_number(data, "ae.evaluate_range", "evaluate data")

    async def release(self, instance_id: str) -> Answer:
        return await self._post("/release", "release", instance_id=instance_id)

    def is_not_found(self, answer: Answer) -> str | None:
        # AgentEvolver itself answers 400 (ValueError) here; any 4xx with success=false conforms.
        problem = self.is_error_shape(answer)
        if problem:
            return problem
        if not isinstance(answer.body, dict) or answer.body.get("success") is not False:
            return f"expected success: false, got {str(answer.body)[:200]}"
        return None

    def is_error_shape(self, answer: Answer) -> str | None:
        problem = super().is_error_shape(answer)
        if problem:
            return problem
        body = answer.body
        if not isinstance(body, dict) or body.get("success") is not False:
            return f"an error must answer success: false, got {str(body)[:200]}"
        if not any(isinstance(body.get(k), str) and body.get(k) for k in ("message", "detail")):
            return f"an error must carry a message, got {str(body)[:200]}"
        return None

    async def malformed_create(self) -> Answer:
        return await self.transport.call("POST", "/create", "malformed create", content=b"{not json",
                                         headers={"content-type": "application/json"})


class V1Api(Api):
    """Our clean /v1 API; errors are `{"error": {"code", "message", "details"}}`."""

    prefix = "v1"

    async def offered(self) -> bool:
        return (await self.transport.call("GET", "/v1/environments", "list environments")).status == 200

    async def task_ids(self, split: str) -> list[str]:
        answer = await self.transport.call("GET", f"/v1/environments/{self.env}/tasks", "list tasks",
                                           params={"split": split})
        body = self._expect(answer, "v1.environments", f"GET /v1/environments/{self.env}/tasks?split={split}")
        ids = body.get("task_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not all(isinstance(t, str) for t in ids):
            raise Violation("v1.environments", f"the task list must hold task_ids (strings), got {str(body)[:200]}")
        return ids

    async def tools(self, task_id: str) -> list[dict[str, Any]]:
        answer = await self.transport.call("GET", f"/v1/environments/{self.env}/tools", "tools",
                                           params={"task_id": task_id})
        tools = answer.body.get("tools") if answer.status == 200 and isinstance(answer.body, dict) else None
        return tools if isinstance(tools, list) else []

    async def create_raw(self, env: str, task_id: str, params: dict[str, Any] | None = None) -> Answer:
        return await self.transport.call("POST", "/v1/instances", "create",
                                         json={"env": env, "task_id": task_id, "params": params or {}})

    async def create(self, task_id: str, params: dict[str, Any] | None = None) -> tuple[str, list[dict[str, Any]]]:
        body = self._expect(await self.create_raw(self.env, task_id, params), "v1.create_shape",
                            f"create({task_id})", (200, 201))
        if not isinstance(body, dict) or not isinstance(body.get("instance_id"), str) \
                or not isinstance(body.get("messages"), list):
            raise Violation("v1.create_shape", f"create must answer instance_id and messages, got {str(body)[:300]}")
        check_opening(body["messages"], "v1.create_shape", "create messages")
        return body["instance_id"], body["messages"]

    async def step_raw(self, instance_id: str, action: Any) -> Answer:
        return await self.transport.call("POST", f"/v1/instances/{instance_id}/step", "step", json={"action": action})

    async def step(self, instance_id: str, action: dict[str, Any]) -> Step:
        body = self._expect(await self.step_raw(instance_id, action), "v1.step_shape", "step")
        if not isinstance(body, dict):
            raise Violation("v1.step_shape", f"step must answer an object, got {str(body)[:200]}")
        check_message(body.get("observation"), "v1.step_shape", "step observation")
        reward = check_number(body.get("reward"), "v1.step_shape", "step reward")
        if not isinstance(body.get("done"), bool):
            raise Violation("v1.step_shape", f"step done must be a boolean, got {body.get('done')!r}")
        if not isinstance(body.get("info", {}), dict):
            raise Violation("v1.step_shape", "step info must be an object")
        return Step(body["observation"], reward, body["done"], body.get("info") or {})

    async def evaluate_raw(self, instance_id: str) -> Answer:
        return await self.transport.call("POST", f"/v1/instances/{instance_id}/evaluate", "evaluate", json={})

    async def evaluate(self, instance_id: str) -> float:
        body = self._expect(await self.evaluate_raw(instance_id), "v1.evaluate_range", "evaluate")
        return check_number(body.get("score") if isinstance(body, dict) else body, "v1.evaluate_range",
                            "evaluate score")

    async def release(self, instance_id: str) -> Answer:
        return await self.transport.call("DELETE", f"/v1/instances/{instance_id}", "release")

    def is_not_found(self, answer: Answer) -> str | None:
        if answer.status != 404:
            return f"expected HTTP 404, got {answer.status}"
        return self.is_error_shape(answer)

    def is_error_shape(self, answer: Answer) -> str | None:
        problem = super().is_error_shape(answer)
        if problem:
            return problem
        error = answer.body.get("error") if isinstance(answer.body, dict) else None
        if not isinstance(error, dict) or not error.get("code") or not error.get("message"):
            return f"an error must be {{\"error\": {{code, message, details}}}}, got {str(answer.body)[:200]}"
        return None

    async def malformed_create(self) -> Answer:
        return await self.transport.call("POST", "/v1/instances", "malformed create", content=b"{not json",
                                         headers={"content-type": "application/json"})

    async def capabilities(self) -> dict[str, Any]:
        """What the environment declares beyond the protocol (`info.capabilities`); {} when it says nothing."""
        answer = await self.transport.call("GET", f"/v1/environments/{self.env}", "describe environment")
        info = answer.body.get("info") if answer.status == 200 and isinstance(answer.body, dict) else None
        declared = info.get("capabilities") if isinstance(info, dict) else None
        return declared if isinstance(declared, dict) else {}

    async def state(self, instance_id: str, check: str) -> Any:
        """The instance's state snapshot: an object, or null for an environment without one."""
        body = self._expect(await self.transport.call("GET", f"/v1/instances/{instance_id}/state", "state"),
                            check, f"GET /v1/instances/{instance_id}/state")
        if not isinstance(body, dict) or "state" not in body:
            raise Violation(check, f"state must answer {{instance_id, state, state_hash}}, got {str(body)[:200]}")
        if body["state"] is not None and not isinstance(body["state"], dict):
            raise Violation(check, f"state must be an object or null, got {type(body['state']).__name__}")
        return body["state"]

    async def fork(self, instance_id: str) -> str:
        body = self._expect(await self.transport.call("POST", f"/v1/instances/{instance_id}/fork", "fork", json={}),
                            "v1.fork", "fork", (201,))
        twin = body.get("instance_id") if isinstance(body, dict) else None
        if not isinstance(twin, str) or not twin or twin == instance_id:
            raise Violation("v1.fork", f"fork must answer a new instance_id, got {str(body)[:200]}")
        return twin
