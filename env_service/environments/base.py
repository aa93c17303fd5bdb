"""The plug-in API every environment implements.

An `Environment` is created once per server (it holds task data and shared config); it creates
one `EnvInstance` per live episode. Instance methods are plain synchronous code: the server runs
them off the event loop (inline backend) or inside a Ray actor (ray backend), so an environment
never needs to know how it is hosted.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from common.config import validate
from common.schemas import ChatMessage, Split

SPLITS: tuple[Split, ...] = ("train", "validation", "test")


class StepResult(BaseModel):
    observation: ChatMessage  # exactly one message (AgentEvolver's contract)
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


class EvalResult(BaseModel):
    score: float = Field(ge=0.0, le=1.0)
    info: dict[str, Any] = Field(default_factory=dict)


class EnvInstance(ABC):
    """One live episode of one task."""

    @abstractmethod
    def reset(self) -> list[ChatMessage]:
        """Start the episode; return exactly [system, user]."""

    @abstractmethod
    def step(self, action: ChatMessage) -> StepResult:
        """Apply one assistant message. Malformed actions get an explanatory observation, never an exception."""

    @abstractmethod
    def evaluate(self, params: dict[str, Any] | None = None) -> EvalResult:
        """Score the episode so far in [0, 1]."""

    def state(self) -> dict[str, Any] | None:
        """A JSON snapshot of the verifiable state, or None when the environment has none."""
        return None

    def state_hash(self) -> str | None:
        """A canonical hash of the state (GiGPO anchor states); derived from `state()` by default."""
        snapshot = self.state()
        if snapshot is None:
            return None
        return hashlib.sha256(json.dumps(snapshot, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def fork(self) -> EnvInstance:
        """An independent copy of this episode in its current state: stepping either one never moves the other.

        Only environments whose `capabilities()` declare `fork` implement it (env_service refuses the route for
        the others, naming what they lack)."""
        raise NotImplementedError(f"{type(self).__name__} cannot copy its state")

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release resources (called once, on release or reap)."""


class Environment(ABC):
    """An environment type, registered by `name` in the server's allowlist."""

    name: ClassVar[str]
    # The environment's own settings (its section `env_service.environments.<name>` of the run YAML) as a
    # pydantic model: the launcher and the service validate the section against it at start, so a misspelled
    # key fails naming its key path (give the model `extra="forbid"`). The validated model is `self.settings`.
    settings_model: ClassVar[type[BaseModel] | None] = None

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = dict(config or {})
        if self.settings_model is not None:
            self.settings = validate(self.settings_model, self.config,
                                     root=f"env_service.environments.{getattr(self, 'name', type(self).__name__)}")

    @abstractmethod
    def task_ids(self, split: Split) -> list[str]:
        """Deterministic task ids of a split."""

    @abstractmethod
    def create(self, task_id: str, params: dict[str, Any] | None = None) -> EnvInstance:
        """A new instance for `task_id`. `params["query"]` replaces the task's user query when given.

        Raises KeyError for an unknown task id.
        """

    def profile(self) -> dict[str, Any]:
        """Entities, their attributes and operations (AgentEvolver's profile shape): input of self-questioning."""
        return {"name": self.name, "background": "", "entities": [], "task_preference": {}}

    def tool_docs(self, task_id: str | None = None) -> list[dict[str, Any]]:
        """OpenAI function schemas of the tools an agent may call (for a task when it matters)."""
        return []

    def unready(self) -> str | None:
        """Why this environment cannot serve right now (say, a server it depends on does not answer),
        or None when it can. The service's /healthz answers 503 with this reason while it is not None."""
        return None

    def capabilities(self) -> dict[str, bool]:
        """What the environment can do beyond the protocol, served in its info as `capabilities`:

        - `fork`: its instances copy their state (`EnvInstance.fork`, `POST /v1/instances/{id}/fork`);
        - `deterministic`: the same actions replayed from a fresh instance of the same task reach the same
          state and the same observations (no wall clock, no unseeded randomness, no generated ids).

        The trainer's paired branches (`trainer.experience.ask_reward: paired_branch`) need one of them."""
        return {"fork": False, "deterministic": False}

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "splits": {s: len(self.task_ids(s)) for s in SPLITS},
                "capabilities": self.capabilities()}

    def reference_episode(self, task_id: str) -> list[ChatMessage] | None:
        """The task solved by its reference, as the episode's messages ([system, user], then each action and the
        observation it got; the closing reply ends it), run in a fresh instance; None when the environment
        publishes no references. The server serves it for train tasks only (`trainer.warm_start`,
        `source: environment`). Raises KeyError for an unknown task id."""
        return None
