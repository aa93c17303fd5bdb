"""The trainer's HTTP peers: the environment service, and optionally experience, task and judge services.

The environment goes through `env_service.client.EnvClient` when that client is present; until it
lands, `EnvPeer` speaks the same documented `/v1` routes with the shared request/response models
in `env_service.protocol`. The optional peers are used only when their client modules exist and
their URL is configured, so the trainer runs with the environment service alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.http import ServiceClient
from common.schemas import ChatMessage, Task
from env_service.protocol import CreateResponse, EvaluateResponse, StepResponse


@dataclass
class Created:
    instance_id: str
    messages: list[ChatMessage]


class EnvPeer(ServiceClient):
    """create -> step* -> evaluate -> state -> release over the env service's /v1 API."""

    async def create(self, env: str, task: Task) -> Created:
        body = {"env": env, "task_id": task.env_task_id, "params": task.create_params()}
        # Not retried by the base client (a POST); the rollout's own bounded retry covers it.
        response = await self.post("/v1/instances", json=body, model=CreateResponse)
        return Created(response.instance_id, list(response.messages))

    async def step(self, instance_id: str, action: str) -> StepResponse:
        return await self.post(f"/v1/instances/{instance_id}/step",
                               json={"action": {"role": "assistant", "content": action}}, model=StepResponse)

    async def evaluate(self, instance_id: str, params: dict[str, Any] | None = None) -> EvaluateResponse:
        return await self.post(f"/v1/instances/{instance_id}/evaluate", json={"params": params or {}},
                               model=EvaluateResponse, idempotent=True)

    async def state(self, instance_id: str) -> dict[str, Any] | None:
        return (await self.get(f"/v1/instances/{instance_id}/state")).get("state")

    async def release(self, instance_id: str) -> bool:
        return bool((await self.delete(f"/v1/instances/{instance_id}")).get("released"))

    async def task_ids(self, env: str, split: str) -> list[str]:
        return list((await self.get(f"/v1/environments/{env}/tasks", params={"split": split}))["task_ids"])
