"""Wire schemas shared by every service: the contract between env, tasks, experience, judge and trainer.

Every model is pydantic v2 and round-trips through JSON unchanged. Token-level fields of a
Trajectory are parallel lists (one entry per token) so they map 1:1 onto tensors.
"""

from __future__ import annotations

import math
import time
import uuid
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator


class WireModel(BaseModel):
    """Base for wire models: unknown fields are rejected so typos surface as 422s, not silent drops."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


# ---------------------------------------------------------------- chat messages


class ToolFunction(WireModel):
    name: str
    # OpenAI sends arguments as a JSON string; we keep that shape on the wire.
    arguments: str = "{}"


class ToolCall(WireModel):
    id: str = Field(default_factory=lambda: new_id("call"))
    type: Literal["function"] = "function"
    function: ToolFunction


class ChatMessage(WireModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def text(self) -> str:
        return self.content or ""


# ---------------------------------------------------------------- tasks

Split = Literal["train", "validation", "test"]


class Task(WireModel):
    """What the trainer may know about a task: never a reference solution."""

    task_id: str
    env_type: str
    split: Split = "train"
    query: str | None = None  # None: the environment's own query for this task id
    # A synthetic task starts the environment on its seed task and replaces the user query.
    seed_task_id: str | None = None
    synthetic: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def env_task_id(self) -> str:
        return self.seed_task_id or self.task_id

    def create_params(self) -> dict[str, Any]:
        """The `params` of an env-service create call that starts this task."""
        return {"query": self.query} if self.synthetic and self.query else {}


# ---------------------------------------------------------------- trajectories


class Step(WireModel):
    """One agent turn: the action taken and what the environment answered."""

    index: int = Field(ge=0)
    action: ChatMessage
    observation: ChatMessage | None = None
    reward: float = 0.0
    done: bool = False
    # Canonical hash of the environment state *before* this action (GiGPO anchor states).
    state_hash: str | None = None
    info: dict[str, Any] = Field(default_factory=dict)


class StepLabel(WireModel):
    step: int = Field(ge=0)
    label: Literal["GOOD", "BAD"]
    reason: str = ""

    @property
    def value(self) -> float:
        return 1.0 if self.label == "GOOD" else -1.0


class Trajectory(WireModel):
    """One rollout. Token fields are parallel per-token lists over prompt + response."""

    trajectory_id: str = Field(default_factory=lambda: new_id("traj"))
    task_id: str
    group_id: str | None = None  # rollouts of the same task in one batch share it (GRPO group)
    env_type: str | None = None
    messages: list[ChatMessage] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    outcome: float | None = None  # final reward in [0, 1] from the environment or the grader

    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)  # per response token: 1 = policy token
    step_ids: list[int] = Field(default_factory=list)  # per response token: its step index, -1 none
    logprobs: list[float] | None = None  # per response token, from the generating policy

    # The experience bit, under this one name end to end (trajectories, veRL extra fields, the loss, the
    # web view): the rollout was generated with injected experience (stripped again for training).
    # `used_experience`, its old name, is still read from stored trajectories.
    experience_flag: bool = Field(default=False, validation_alias=AliasChoices("experience_flag", "used_experience"))
    experience_ids: list[str] = Field(default_factory=list)
    policy_version: int = 0
    truncated: bool = False  # ended by max turns / max context, not by the environment
    labels: list[StepLabel] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("outcome")
    @classmethod
    def _finite_outcome(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("outcome must be a finite number")
        return v

    @model_validator(mode="after")
    def _token_fields_align(self) -> Trajectory:
        n = len(self.response_ids)
        for name in ("loss_mask", "step_ids"):
            got = len(getattr(self, name))
            if got not in (0, n):
                raise ValueError(f"{name} has {got} entries but response_ids has {n}")
        if self.logprobs is not None and len(self.logprobs) not in (0, n):
            raise ValueError(f"logprobs has {len(self.logprobs)} entries but response_ids has {n}")
        return self


# ---------------------------------------------------------------- experiences


class ExperienceKind(str, Enum):
    success = "success"
    failure = "failure"
    comparative = "comparative"
    case = "case"
    manual = "manual"


class ExperienceUsage(WireModel):
    uses: int = 0
    successes: int = 0
    reward_sum: float = 0.0
    advantage_sum: float = 0.0  # sum of (reward - no-experience baseline), where known
    advantage_count: int = 0

    @property
    def utility(self) -> float:
        """Laplace-smoothed success rate (s+1)/(n+2)."""
        return (self.successes + 1) / (self.uses + 2)

    @property
    def mean_advantage(self) -> float | None:
        return self.advantage_sum / self.advantage_count if self.advantage_count else None


class Provenance(WireModel):
    task_ids: list[str] = Field(default_factory=list)
    trajectory_ids: list[str] = Field(default_factory=list)
    author: str = "heuristic"


# The experience text contract, declared once: every model that carries an experience's text (here, and the
# experience manager's requests in experience_manager/protocol.py) types it with these.
WHEN_TO_USE_MAX_CHARS = 1_000
CONTENT_MAX_CHARS = 4_000
WhenToUse = Annotated[str, Field(min_length=1, max_length=WHEN_TO_USE_MAX_CHARS)]
ExperienceContent = Annotated[str, Field(min_length=1, max_length=CONTENT_MAX_CHARS)]


class Experience(WireModel):
    experience_id: str = Field(default_factory=lambda: new_id("exp"))
    workspace_id: str = "default"
    when_to_use: WhenToUse
    content: ExperienceContent
    kind: ExperienceKind = ExperienceKind.case
    tags: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    quality: float = Field(default=0.5, ge=0.0, le=1.0)
    support: int = 1  # how many times the same advice was distilled
    provenance: Provenance = Field(default_factory=Provenance)
    usage: ExperienceUsage = Field(default_factory=ExperienceUsage)
    status: Literal["active", "archived"] = "active"
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    content_hash: str = ""
    embedding_model: str = ""
    # The solved trajectory it was distilled from, as chat turns (task query, assistant turns as written,
    # observations), for `trainer.experience.inject: turns`; None for advice without one and for old pools.
    demonstration: list[ChatMessage] | None = None
    # The kind of task it was distilled from (the task manager's `metadata.task_kind`: what, tool signature,
    # form), when the trajectory said: experiences of different kinds are never merged, and retrieval for a
    # task of a known kind prefers its own kind.
    task_kind: str | None = None
