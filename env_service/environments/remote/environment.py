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
from pydantic import Field, field_validator, model_validator

from common.config import StrictModel, validate
from common.schemas import ChatMessage, Split
from env_service.environments.base import SPLITS, EnvInstance, Environment, EvalResult, StepResult

from .protocols import AgentEvolverProtocol, RemoteProtocol, V1Protocol

PROBE_TIMEOUT_S = 5.0


class RemoteConfig(StrictModel):
    """The `remote` section of the env service config: where the other env server is and how to talk to it."""

    url: str = Field(description="base URL of the other env server (http:// or https://), e.g. "
                                 "http://127.0.0.1:8081; the launcher checks it answers before anything starts")
    protocol: Literal["v1", "agentevolver"] = Field(
        default="v1", description="v1: our /v1 API (docs/environment-protocol.md); agentevolver: AgentEvolver's "
                                  "/create, /step, /evaluate, /release, /get_env_profile, /get_info routes")
    env_type: str | None = Field(
        default=None, description="required: the environment's name on the other server (v1: one of the names "
                                  "its GET /v1/environments lists; agentevolver: the env_type its routes expect)")
    timeout_s: float = Field(default=60.0, gt=0, description="per request to the other server")
    # The bearer token is a secret: only the *name* of the environment variable holding it is config.
    api_token_env: str | None = Field(default=None, description="name of the environment variable holding the "
                                                                 "other server's bearer token (never the token)")
    max_connections: int = Field(default=256, ge=1, description="keep-alive connections to the other server")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {value!r}")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _names_the_environment(self) -> RemoteConfig:
        if not self.env_type:
            raise ValueError(f"env_type is missing: name the environment the server at {self.url} serves "
                             f"(v1: one of the names its GET /v1/environments lists; agentevolver: its env_type)")
        return self


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
        self.settings = validate(RemoteConfig, self.config, root="env_service.environments.remote")
        token = os.environ.get(self.settings.api_token_env) if self.settings.api_token_env else None
        if self.settings.api_token_env and not token:
            raise ValueError(f"api_token_env names {self.settings.api_token_env!r}, which is not set")
        limits = httpx.Limits(max_connections=self.settings.max_connections,
                              max_keepalive_connections=self.settings.max_connections)
        self.http = httpx.Client(base_url=self.settings.url, timeout=self.settings.timeout_s, limits=limits,
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
        protocol_class = V1Protocol if self.settings.protocol == "v1" else AgentEvolverProtocol
        assert self.settings.env_type is not None  # the settings' own check
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

    def unready(self) -> str | None:
        """Why this environment cannot serve now (the other server does not answer), else None.

        Any HTTP answer counts: the probe asks whether the server is there, not what it serves."""
        try:
            self.http.get("/healthz", timeout=min(self.settings.timeout_s, PROBE_TIMEOUT_S))
        except httpx.HTTPError as exc:
            return (f"the remote env server {self.settings.url} (env_type {self.settings.env_type!r}) "
                    f"did not answer: {type(exc).__name__}: {exc}")
        return None

    def info(self) -> dict[str, Any]:
        return {**super().info(), "url": self.settings.url, "protocol": self.settings.protocol,
                "env_type": self.settings.env_type}
