"""The two wire protocols a remote env server may speak: our `/v1` API and AgentEvolver's routes."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any

import httpx
from pydantic import ValidationError

from common.schemas import ChatMessage
from env_service.environments.base import EvalResult, StepResult
from env_service.host import HostError

_MESSAGE_FIELDS = ("role", "content", "tool_calls", "tool_call_id", "name")


def to_message(raw: Any, what: str) -> ChatMessage:
    """A remote message as our ChatMessage; fields we do not model (AgentEvolver extras) are dropped."""
    if not isinstance(raw, dict):
        raise HostError(502, "remote_protocol", f"{what}: expected a message object, got {type(raw).__name__}")
    fields = {k: raw[k] for k in _MESSAGE_FIELDS if raw.get(k) is not None}
    if fields.get("content") is not None and not isinstance(fields["content"], str):
        fields["content"] = json.dumps(fields["content"], ensure_ascii=False)
    try:
        return ChatMessage.model_validate(fields)
    except ValidationError as exc:
        raise HostError(502, "remote_protocol", f"{what}: not a chat message: {exc.errors()[0]['msg']}") from None


def remote_error(what: str, response: httpx.Response | None = None, exc: Exception | None = None) -> HostError:
    """A HostError the service answers as 502/504, naming the remote and what it said."""
    if exc is not None:
        status = 504 if isinstance(exc, httpx.TimeoutException) else 502
        return HostError(status, "remote_unavailable", f"{what}: the remote env server did not answer: {exc!r}")
    assert response is not None
    try:
        body = response.json()
    except (json.JSONDecodeError, ValueError):
        body = response.text[:500]
    message = body
    if isinstance(body, dict):
        message = body.get("message") or body.get("detail") or (body.get("error") or {}).get("message") or body
    return HostError(502, "remote_error", f"{what}: the remote env server answered {response.status_code}: {message}",
                     {"remote_status": response.status_code})


class RemoteProtocol(ABC):
    def __init__(self, http: httpx.Client, env_type: str) -> None:
        self.http, self.env_type = http, env_type

    def _request(self, method: str, path: str, what: str, *, lost_on_404: str | None = None, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise remote_error(what, exc=exc) from None
        if response.status_code == 404 and lost_on_404:
            raise HostError(410, "instance_lost", f"{what}: the remote server no longer has instance "
                            f"{lost_on_404!r}; create a new one")
        if response.status_code >= 400:
            raise remote_error(what, response)
        try:
            return response.json()
        except ValueError:
            raise HostError(502, "remote_protocol", f"{what}: the remote answered non-JSON: "
                            f"{response.text[:200]!r}") from None

    @abstractmethod
    def task_ids(self, split: str) -> list[str]: ...

    @abstractmethod
    def create(self, task_id: str, params: dict[str, Any]) -> tuple[str, list[ChatMessage]]: ...

    @abstractmethod
    def step(self, remote_id: str, action: ChatMessage) -> StepResult: ...

    @abstractmethod
    def evaluate(self, remote_id: str, params: dict[str, Any]) -> EvalResult: ...

    def state(self, remote_id: str) -> dict[str, Any] | None:
        return None

    @abstractmethod
    def release(self, remote_id: str) -> None: ...

    def profile(self) -> dict[str, Any] | None:
        return None

    def tool_docs(self, task_id: str | None) -> list[dict[str, Any]]:
        return []


def _score(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise HostError(502, "remote_protocol", f"{what}: the remote score {value!r} is not a number in [0, 1]")
    return float(value)


class V1Protocol(RemoteProtocol):
    """Our own /v1 API (see env_service/app.py)."""

    def task_ids(self, split: str) -> list[str]:
        body = self._request("GET", f"/v1/environments/{self.env_type}/tasks", "list tasks", params={"split": split})
        return list(body["task_ids"])

    def create(self, task_id: str, params: dict[str, Any]) -> tuple[str, list[ChatMessage]]:
        body = self._request("POST", "/v1/instances", "create",
                             json={"env": self.env_type, "task_id": task_id, "params": params})
        return body["instance_id"], [to_message(m, "create") for m in body["messages"]]

    def step(self, remote_id: str, action: ChatMessage) -> StepResult:
        body = self._request("POST", f"/v1/instances/{remote_id}/step", "step", lost_on_404=remote_id,
                             json={"action": action.model_dump(exclude_none=True)})
        return StepResult(observation=to_message(body["observation"], "step"), reward=float(body.get("reward", 0.0)),
                          done=bool(body.get("done", False)), info=dict(body.get("info") or {}))

    def evaluate(self, remote_id: str, params: dict[str, Any]) -> EvalResult:
        body = self._request("POST", f"/v1/instances/{remote_id}/evaluate", "evaluate", lost_on_404=remote_id,
                             json={"params": params})
        return EvalResult(score=_score(body.get("score"), "evaluate"), info=dict(body.get("info") or {}))

    def state(self, remote_id: str) -> dict[str, Any] | None:
        return self._request("GET", f"/v1/instances/{remote_id}/state", "state", lost_on_404=remote_id).get("state")

    def release(self, remote_id: str) -> None:
        self._request("DELETE", f"/v1/instances/{remote_id}", "release")

    def profile(self) -> dict[str, Any] | None:
        return self._request("GET", f"/v1/environments/{self.env_type}/profile", "profile")

    def tool_docs(self, task_id: str | None) -> list[dict[str, Any]]:
        params = {"task_id": task_id} if task_id else {}
        return list(self._request("GET", f"/v1/environments/{self.env_type}/tools", "tools", params=params)["tools"])


class AgentEvolverProtocol(RemoteProtocol):
    """AgentEvolver's env service routes: `{"success", "data"}` answers, no state snapshot."""

    def _post(self, path: str, what: str, lost_on_404: str | None = None, **body: Any) -> Any:
        answer = self._request("POST", path, what, lost_on_404=lost_on_404, json={"env_type": self.env_type, **body})
        if not isinstance(answer, dict) or not answer.get("success"):
            message = answer.get("message") if isinstance(answer, dict) else answer
            raise HostError(502, "remote_error", f"{what}: the remote answered success=false: {message}")
        return answer.get("data")

    def task_ids(self, split: str) -> list[str]:
        return list(self._post("/get_env_profile", "get_env_profile", params={"split": split}))

    def create(self, task_id: str, params: dict[str, Any]) -> tuple[str, list[ChatMessage]]:
        data = self._post("/create", "create", task_id=task_id, params=params)
        return data["info"]["instance_id"], [to_message(m, "create") for m in data["state"]]

    def step(self, remote_id: str, action: ChatMessage) -> StepResult:
        data = self._post("/step", "step", lost_on_404=remote_id, instance_id=remote_id,
                          messages=action.model_dump(exclude_none=True))
        messages = [to_message(m, "step") for m in data["state"]]
        if len(messages) != 1:  # AgentEvolver's own contract; join rather than drop if a server breaks it
            messages = [ChatMessage(role=messages[-1].role if messages else "user",
                                    content="\n".join(m.text() for m in messages))]
        return StepResult(observation=messages[0], reward=float(data.get("reward") or 0.0),
                          done=bool(data.get("is_terminated", False)), info=dict(data.get("info") or {}))

    def evaluate(self, remote_id: str, params: dict[str, Any]) -> EvalResult:
        return EvalResult(score=_score(self._post("/evaluate", "evaluate", lost_on_404=remote_id,
                                                  instance_id=remote_id, params=params), "evaluate"))

    def release(self, remote_id: str) -> None:
        # AgentEvolver answers success=false for an id it does not know: released either way.
        try:
            self._request("POST", "/release", "release", json={"env_type": self.env_type, "instance_id": remote_id})
        except HostError as exc:
            if exc.details is None or exc.details.get("remote_status") != 404:
                raise

    def tool_docs(self, task_id: str | None) -> list[dict[str, Any]]:
        text = self._post("/get_info", "get_info", task_id=task_id)
        try:  # our server answers OpenAI tool schemas as JSON; AgentEvolver's envs answer free text
            tools = json.loads(text) if isinstance(text, str) else text
        except json.JSONDecodeError:
            return []  # free text is no tool schema; such an env describes its tools in its prompt
        return [t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []
