"""Settings of the environment service: the `env_service` section of the run YAML.

    env_service:
      environments:            # enabled environments and their config (a list of names also works)
        flights: {}
        gym: {envs: [FrozenLake-v1, Taxi-v4, CliffWalking-v1]}
      backend: inline          # inline (threads in this process) or ray (a pool of actors, placed by `ray:`)
      max_instances: 2048      # over it, create answers 429 with Retry-After
      instance_ttl_s: 1800     # idle instances are released after this long
      call_timeout_s: 60       # per step/evaluate/state call

It also holds what the launcher checks of the section before anything starts: the built-in environments'
names (the allowlist `env_service.registry` loads from) and the settings models of the light ones.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from common.config import StrictModel, validate
from common.service import ServiceSettings

DEFAULT_ENVIRONMENTS: dict[str, dict[str, Any]] = {"flights": {}, "gym": {}, "bfcl": {}}

BUILTIN_ENVIRONMENTS: dict[str, str] = {
    "flights": "env_service.environments.flights:FlightsEnvironment",
    "gym": "env_service.environments.gym:GymEnvironment",
    "bfcl": "env_service.environments.bfcl:BfclEnvironment",
    "remote": "env_service.environments.remote:RemoteEnvironment",
    "signal": "env_service.environments.signal:SignalEnvironment",
    "gem": "env_service.environments.gem:GemEnvironment",
    "reasoning_gym": "env_service.environments.reasoning:ReasoningGymEnvironment",
    "textarena": "env_service.environments.arena:TextArenaEnvironment",
    "textworld": "env_service.environments.textworld_games:TextWorldEnvironment",
    "scienceworld": "env_service.environments.scienceworld_tasks:ScienceWorldEnvironment",
    "babyai": "env_service.environments.babyai:BabyAIEnvironment",
}

# The settings models of built-in environments whose modules import light (no suite package): the
# launcher validates these sections before anything starts, so a typo fails in --dry-run.
CONFIG_MODELS: dict[str, str] = {
    "remote": "env_service.environments.remote.environment:RemoteConfig",
    "signal": "env_service.environments.signal.environment:SignalConfig",
}


def config_model(name: str) -> type[BaseModel] | None:
    """The settings model of built-in environment `name`, when it has a light one."""
    spec = CONFIG_MODELS.get(name)
    if spec is None:
        return None
    module_name, _, class_name = spec.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def validate_environment_configs(enabled: Mapping[str, Mapping[str, Any] | None],
                                 root: str = "env_service.environments") -> None:
    """Check each enabled environment's section against its settings model (unknown keys, bad values)."""
    for name, config in enabled.items():
        model = config_model(name)
        if model is not None:
            validate(model, dict(config or {}), root=f"{root}.{name}")


class RaySettings(StrictModel):
    """Where the env workers (Ray actors, each hosting many instances) run in the cluster.

        ray:
          actors: 4
          node_labels: {evolver/role: env}   # prefer nodes started with `ray start --labels evolver/role=env`
          resources: {}                      # or require a custom resource, e.g. {env_node: 0.01}
    """

    actors: int = Field(default=2, ge=1, le=256)  # the fixed pool; each hosts many instances
    address: str | None = None  # an existing cluster; None starts a local Ray
    max_concurrency: int = Field(default=32, ge=1)  # concurrent calls per actor (different instances)
    num_cpus: float = Field(default=0.0, ge=0)  # per actor; 0 lets a small machine host many
    health_check_s: float = Field(default=5.0, gt=0)
    placement: Literal["spread", "pack"] = Field(default="spread", description=(
        "spread: Ray's SPREAD strategy puts the actors on as many nodes as it can; pack: Ray's default "
        "(fill a node first). Ignored when node_labels is set"))
    node_labels: dict[str, str] = Field(default_factory=dict, description=(
        "prefer nodes with these labels (a soft constraint: when none is left, say after a node's loss, the "
        "replacement actors run on the other nodes)"))
    resources: dict[str, float] = Field(default_factory=dict, description=(
        "custom Ray resources each actor needs (a hard constraint: an actor waits until a node offers them)"))


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
