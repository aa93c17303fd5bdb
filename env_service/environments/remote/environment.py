"""`remote`: an environment served by another env server, reached over HTTP.

This is how a user plugs in a new environment without touching our code: serve it with any
server that speaks our `/v1` API or AgentEvolver's routes (`/create`, `/step`, `/evaluate`,
`/release`, `/get_env_profile`, `/get_info`), then enable `remote` with its URL:

    env_service:
      environments:
        remote: {url: "http://127.0.0.1:8081", protocol: agentevolver, env_type: appworld}

Instance methods are synchronous (the service runs them on worker threads or in Ray actors), so
one keep-alive `httpx.Client` per environment is shared by all its instances.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import httpx
from pydantic import Field, field_validator

from common.config import StrictModel
from common.schemas import ChatMessage, Split
from env_service.environments.base import SPLITS, EnvInstance, Environment, EvalResult, StepResult

from .protocols import AgentEvolverProtocol, RemoteProtocol, V1Protocol


class RemoteConfig(StrictModel):
    """The `remote` section of the env service config."""

    url: str = Field(description="base URL of the other env server, e.g. http://127.0.0.1:8081")
    protocol: Literal["v1", "agentevolver"] = "v1"
    env_type: str = Field(min_length=1, description="the environment's name on the other server")
    timeout_s: float = Field(default=60.0, gt=0)
    # The bearer token is a secret: only the *name* of the environment variable holding it is config.
    api_token_env: str | None = None
    max_connections: int = Field(default=256, ge=1)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {value!r}")
        return value.rstrip("/")


class RemoteInstance(EnvInstance):
    def __init__(self, protocol: RemoteProtocol, task_id: str, params: dict[str, Any]) -> None:
        self.protocol, self.task_id, self.params = protocol, task_id, params
        self.remote_id: str | None = None

    def reset(self) -> list[ChatMessage]:
        self.close()  # a second reset starts a fresh remote episode
        self.remote_id, messages = self.protocol.create(self.task_id, self.params)
        return messages

    def _id(self) -> str:
        if self.remote_id is None:
            raise RuntimeError("the remote instance is not started: call reset() first")
        return self.remote_id

    def step(self, action: ChatMessage) -> StepResult:
        return self.protocol.step(self._id(), action)

    def evaluate(self, params: dict[str, Any] | None = None) -> EvalResult:
        return self.protocol.evaluate(self._id(), dict(params or {}))

    def state(self) -> dict[str, Any] | None:
        return self.protocol.state(self._id())

    def close(self) -> None:
        if self.remote_id is not None:
            remote_id, self.remote_id = self.remote_id, None
            self.protocol.release(remote_id)


class RemoteEnvironment(Environment):
    name = "remote"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__(config)
        self.settings = RemoteConfig.model_validate(self.config)
        token = os.environ.get(self.settings.api_token_env) if self.settings.api_token_env else None
        if self.settings.api_token_env and not token:
            raise ValueError(f"api_token_env names {self.settings.api_token_env!r}, which is not set")
        limits = httpx.Limits(max_connections=self.settings.max_connections,
                              max_keepalive_connections=self.settings.max_connections)
        self.http = httpx.Client(base_url=self.settings.url, timeout=self.settings.timeout_s, limits=limits,
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
        protocol_class = V1Protocol if self.settings.protocol == "v1" else AgentEvolverProtocol
        self.protocol: RemoteProtocol = protocol_class(self.http, self.settings.env_type)
        self._task_ids: dict[str, list[str]] = {}
        self._known: set[str] = set()

    def task_ids(self, split: Split) -> list[str]:
        # Splits are deterministic by contract, so one fetch per split is enough.
        if split not in self._task_ids:
            self._task_ids[split] = self.protocol.task_ids(split)
            self._known.update(self._task_ids[split])
        return list(self._task_ids[split])

    def create(self, task_id: str, params: dict[str, Any] | None = None) -> RemoteInstance:
        for split in SPLITS:
            self.task_ids(split)  # fetched once, then cached
        if task_id not in self._known:
            raise KeyError(f"the remote {self.settings.env_type!r} at {self.settings.url} has no task {task_id!r}")
        return RemoteInstance(self.protocol, task_id, dict(params or {}))

    def profile(self) -> dict[str, Any]:
        return self.protocol.profile() or super().profile()

    def tool_docs(self, task_id: str | None = None) -> list[dict[str, Any]]:
        return self.protocol.tool_docs(task_id)

    def info(self) -> dict[str, Any]:
        return {**super().info(), "url": self.settings.url, "protocol": self.settings.protocol,
                "env_type": self.settings.env_type}
