"""Settings of the environment service: the `env_service` section of the run YAML.

    env_service:
      environments:            # enabled environments and their config (a list of names also works)
        flights: {}
        gym: {envs: [FrozenLake-v1, Taxi-v4, CliffWalking-v1]}
      backend: inline          # inline (threads in this process) or ray (a pool of actors)
      max_instances: 2048      # over it, create answers 429 with Retry-After
      instance_ttl_s: 1800     # idle instances are released after this long
      call_timeout_s: 60       # per step/evaluate/state call
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from common.config import StrictModel
from common.service import ServiceSettings

DEFAULT_ENVIRONMENTS: dict[str, dict[str, Any]] = {"flights": {}, "gym": {}, "bfcl": {}}


class RaySettings(StrictModel):
    actors: int = Field(default=2, ge=1, le=256)  # the fixed pool; each hosts many instances
    address: str | None = None  # an existing cluster; None starts a local Ray
    max_concurrency: int = Field(default=32, ge=1)  # concurrent calls per actor (different instances)
    num_cpus: float = Field(default=0.0, ge=0)  # per actor; 0 lets a small machine host many
    health_check_s: float = Field(default=5.0, gt=0)


class EnvServiceSettings(ServiceSettings):
    port: int = Field(default=8080, ge=0, le=65535)
    environments: dict[str, dict[str, Any] | None] = Field(default_factory=lambda: dict(DEFAULT_ENVIRONMENTS))
    plugins: dict[str, str] = Field(default_factory=dict)  # extra name -> "module:Class"
    backend: Literal["inline", "ray"] = "inline"
    max_instances: int = Field(default=2048, ge=1)
    instance_ttl_s: float = Field(default=1800.0, gt=0)
    reap_interval_s: float = Field(default=30.0, gt=0)
    call_timeout_s: float = Field(default=60.0, gt=0)
    create_timeout_s: float = Field(default=120.0, gt=0)
    retry_after_s: int = Field(default=2, ge=1)
    threads: int = Field(default=8, ge=1, le=512)  # inline backend worker threads
    ray: RaySettings = Field(default_factory=RaySettings)

    @field_validator("environments", mode="before")
    @classmethod
    def _names_to_mapping(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return {str(name): {} for name in value}
        return value
