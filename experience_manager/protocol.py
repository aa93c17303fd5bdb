"""The experience manager's wire types: the request bodies of the `/v1` API and of the ReMe-compatible routes.

Public (other packages may import it): the validation here is the contract, for example that experience
text never carries injection markers or chat special tokens.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from common.schemas import (
    ChatMessage,
    ExperienceContent,
    ExperienceKind,
    ExperienceUsage,
    Provenance,
    Trajectory,
    WhenToUse,
    WireModel,
)
from experience_manager.text import ID_PATTERN, REQUEST_ID_PATTERN, forbidden_markup, valid_id

RequestId = Field(default=None, pattern=REQUEST_ID_PATTERN,
                  description="makes the mutation idempotent: a retry with the same id returns the first answer")


def _clean(value: str, name: str) -> str:
    marker = forbidden_markup(value)
    if marker:
        raise ValueError(f"{name} contains {marker!r}: injection markers and chat special tokens are not "
                         f"allowed (they would break experience stripping in the trainer)")
    return value


# ---------------------------------------------------------------- /v1 request models


class SummarizeRequest(WireModel):
    trajectories: list[Trajectory] = Field(min_length=1)
    mode: Literal["auto", "llm", "heuristic"] | None = None
    request_id: str | None = RequestId
    run_async: bool = Field(default=False, alias="async", description="run as a job; poll GET /v1/jobs/{job_id}")


class RetrieveRequest(WireModel):
    query: str | None = Field(default=None, min_length=1, max_length=100_000)
    messages: list[dict[str, Any]] | None = None
    top_k: int | None = Field(default=None, ge=1, le=50)
    min_similarity: float | None = Field(default=None, ge=-1.0, le=2.0)
    exclude_ids: list[str] = Field(default_factory=list, max_length=1000)
    # The task's kind (the task manager's `metadata.task_kind`), when known: experiences of that kind rank first.
    task_kind: str | None = Field(default=None, min_length=1, max_length=500)

    @model_validator(mode="after")
    def _one_query(self) -> RetrieveRequest:
        if (self.query is None) == (self.messages is None):
            raise ValueError("give exactly one of `query` (the task text) or `messages` (the initial chat messages)")
        return self


class BatchRetrieveRequest(WireModel):
    queries: list[str] = Field(min_length=1, max_length=512)
    top_k: int | None = Field(default=None, ge=1, le=50)
    min_similarity: float | None = Field(default=None, ge=-1.0, le=2.0)
    exclude_ids: list[str] = Field(default_factory=list, max_length=1000)


def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


class FeedbackItem(WireModel):
    experience_ids: list[str] = Field(min_length=1, max_length=50)
    reward: float
    success: bool | None = Field(default=None, description="default: reward >= summary.success_threshold")
    baseline: float | None = Field(default=None, description="mean reward of the same task's no-experience rollouts")

    @field_validator("reward", "baseline")
    @classmethod
    def _finite_numbers(cls, value: float | None) -> float | None:
        return _finite(value)

    @field_validator("experience_ids")
    @classmethod
    def _ids(cls, ids: list[str]) -> list[str]:
        bad = [i for i in ids if not valid_id(i)]
        if bad:
            raise ValueError(f"experience ids must match {ID_PATTERN}: {bad[:3]}")
        return ids


class FeedbackRequest(WireModel):
    items: list[FeedbackItem] = Field(min_length=1, max_length=10_000)
    request_id: str | None = RequestId


class ExperienceCreate(WireModel):
    when_to_use: WhenToUse
    content: ExperienceContent
    kind: ExperienceKind = ExperienceKind.manual
    tags: list[str] = Field(default_factory=list, max_length=20)
    tools: list[str] = Field(default_factory=list, max_length=50)
    quality: float = Field(default=0.5, ge=0.0, le=1.0)
    task_ids: list[str] = Field(default_factory=list, max_length=10)
    author: str | None = Field(default=None, max_length=100)
    request_id: str | None = RequestId

    @field_validator("when_to_use", "content")
    @classmethod
    def _no_markup(cls, value: str, info) -> str:
        return _clean(value, info.field_name)


class ExperiencePatch(WireModel):
    when_to_use: WhenToUse | None = None
    content: ExperienceContent | None = None
    kind: ExperienceKind | None = None
    tags: list[str] | None = Field(default=None, max_length=20)
    tools: list[str] | None = Field(default=None, max_length=50)
    quality: float | None = Field(default=None, ge=0.0, le=1.0)
    status: Literal["active", "archived"] | None = None
    request_id: str | None = RequestId

    @field_validator("when_to_use", "content")
    @classmethod
    def _no_markup(cls, value: str | None, info) -> str | None:
        return None if value is None else _clean(value, info.field_name)


class ImportItem(BaseModel):
    """An experience from an export; stored fields we recompute (hash, vectors, workspace) are ignored."""

    model_config = ConfigDict(extra="ignore")
    experience_id: str | None = Field(default=None, pattern=ID_PATTERN)
    when_to_use: WhenToUse
    content: ExperienceContent
    kind: ExperienceKind = ExperienceKind.manual
    tags: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    quality: float = Field(default=0.5, ge=0.0, le=1.0)
    support: int = Field(default=1, ge=1)
    provenance: Provenance | None = None
    usage: ExperienceUsage | None = None
    status: Literal["active", "archived"] | None = None
    created_at: float | None = None
    demonstration: list[ChatMessage] | None = Field(default=None, max_length=64)
    task_kind: str | None = Field(default=None, min_length=1, max_length=500)

    @field_validator("when_to_use", "content")
    @classmethod
    def _no_markup(cls, value: str, info) -> str:
        return _clean(value, info.field_name)

    @field_validator("demonstration")
    @classmethod
    def _clean_demonstration(cls, demo: list[ChatMessage] | None) -> list[ChatMessage] | None:
        # Replayed as chat turns by `inject: turns`: a special token would break the chat template.
        for n, message in enumerate(demo or []):
            _clean(message.text(), f"demonstration[{n}].content")
        return demo


class ImportRequest(WireModel):
    experiences: list[ImportItem] = Field(max_length=100_000)
    keep_usage: bool = True
    request_id: str | None = RequestId


class ExportRequest(WireModel):
    include_archived: bool = True
    write_file: bool = Field(default=False, description="also write <store>/exports/<ws>.jsonl atomically")


class PruneRequest(WireModel):
    dry_run: bool = False
    request_id: str | None = RequestId


# ---------------------------------------------------------------- ReMe-compatible models


class ReMeMessage(BaseModel):
    """An OpenAI-style chat message as ReMe takes it: any other keys pass through, but the fields read here
    must have their types (a `tool_calls: 5` is refused naming the field, not stored as a call-less step)."""
    model_config = ConfigDict(extra="allow")
    role: str | None = None
    content: str | list[dict[str, Any]] | None = None  # text, or OpenAI content parts
    tool_calls: list[dict[str, Any]] | None = None

    def as_sent(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class ReMeTrajectory(BaseModel):
    model_config = ConfigDict(extra="allow")
    messages: list[ReMeMessage] = Field(min_length=1)
    score: float = 0.0
    task_id: str | None = None
    query: str | None = None


class ReMeSummaryRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # ReMe flows take free-form JSON
    workspace_id: str = "default"
    trajectories: list[ReMeTrajectory] = Field(min_length=1)


class ReMeRetrieveRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    workspace_id: str = "default"
    query: str | None = None
    messages: list[ReMeMessage] | None = None
    top_k: int = Field(default=3, ge=1, le=50)


class ReMeError(BaseModel):
    """An error on the ReMe-compatible routes, in ReMe's response shape."""

    answer: str
    messages: list[Any]
    success: bool
    metadata: dict[str, Any]

