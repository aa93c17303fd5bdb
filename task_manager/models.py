"""The task manager's own records: explorations, proposals, references and stored tasks.

Only `common.schemas.Task` ever leaves the service towards the trainer. Everything here that
holds a reference solution (`Reference`, `StoredTask`) stays inside the service and its store.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from common.schemas import Task, new_id


class Call(BaseModel):
    """One tool call: a function name and its keyword arguments."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)

    def render(self) -> str:
        """The call as an assistant message the env's action parser accepts (a <tool_call> block)."""
        return "<tool_call>" + json.dumps({"name": self.name, "arguments": self.arguments}) + "</tool_call>"

    def key(self) -> str:
        return json.dumps([self.name, self.arguments], sort_keys=True, default=str)


class ExploreStep(BaseModel):
    index: int
    phase: Literal["breadth", "depth"]
    action: str  # the assistant message content sent to the environment
    calls: list[Call] = Field(default_factory=list)  # what the explorer meant to call, when known
    observation: str = ""
    failed: bool = False  # the environment answered with an error
    state: Any = None  # comparable state snapshot after the step (None: env has no state)
    state_changed: bool = False


class Exploration(BaseModel):
    exploration_id: str = Field(default_factory=lambda: new_id("expl"))
    job_id: str = ""
    episode: int = 0
    env_type: str
    seed_task_id: str
    explorer: str
    # The seed task's own messages: kept for the record, masked before any synthesizer sees them.
    initial_messages: list[dict[str, Any]] = Field(default_factory=list)
    initial_state: Any = None
    steps: list[ExploreStep] = Field(default_factory=list)
    # The first environment error a step met (the environment raised, or answered what JSON cannot carry):
    # env_service ended the episode there.
    environment_error: str | None = None

    @property
    def states_reached(self) -> int:
        return sum(1 for s in self.steps if s.state_changed)


class LookupTarget(BaseModel):
    """What a lookup proposal asks: the profile's lookup `kind`, the record it reads and its answer."""

    kind: str
    operation: str  # the read tool whose observation holds the record
    field: str  # the record field that answers
    select: Literal["each", "min", "max"] = "each"
    of: str | None = None  # min/max: the field compared (default `field`)
    where: list[str] = Field(default_factory=list)  # fields that must be positive for a record to count
    # The fields the query names: for `each`, they single the record out; for min/max, the group it is chosen
    # from (a route and date).
    identity: dict[str, Any] = Field(default_factory=dict)
    answer: str
    wrong_answers: list[str] = Field(default_factory=list)  # values of the same field that must not be stated


class Proposal(BaseModel):
    """A task a synthesizer proposes, before verification."""

    query: str
    confidence: float = 1.0
    actions: list[str]  # assistant messages to replay, in order
    calls: list[Call] | None = None  # structured form when known (hindsight)
    # What the environment answered to each action when the proposal was recorded (hindsight):
    # lets replay map generated ids (order numbers) of the recording to the replay's own.
    observations: list[str] | None = None
    recorded_initial_state: Any = None  # the recording's initial state (full snapshot), for id mapping
    goal_state: Any = None  # the comparable state the synthesizer expects the actions to reach, when known
    generated: list[str] = Field(default_factory=list)  # recorded values known to be generated ids
    synthesizer: str
    env_type: str
    seed_task_id: str
    exploration_id: str = ""
    query_form: Literal["ids", "names", "free"] = "ids"  # free: written by an LLM
    # A lookup (a question answered in text): how to find its record again in a replay, and the answer.
    lookup: LookupTarget | None = None
    # A multi-call task: its kind in the profile's `tasks` (book_by_id); its reference calls are in `calls`.
    task: str | None = None
    # What the task's query selects (the cheapest flight of a route and date): the reference's own reads must
    # select the same records in a fresh instance (`answer`: the value of `field` of the record selected).
    selections: list[LookupTarget] = Field(default_factory=list)


class Reference(BaseModel):
    """A verified reference solution. Never leaves the service."""

    actions: list[str]
    calls: list[Call] | None = None
    observations: list[str] = Field(default_factory=list)  # from the verifying replay
    initial_state: Any = None  # full snapshot at the start of the verifying replay (for id mapping)
    end_state: Any = None  # comparable state after the replay (None: env has no state)
    end_state_hash: str | None = None
    # A lookup's answer: the task is solved by a closing text reply that states it and no other value of its sort
    # (`common.answers.answer_alone`); `wrong_answers` are the competing values the exploration saw.
    answer: str | None = None
    wrong_answers: list[str] = Field(default_factory=list)

    def outcome_hash(self) -> str | None:
        """What proves two tasks different: the end state, and for a lookup also its answer (every lookup of
        one seed task ends in the same, unchanged, state)."""
        if self.answer is None:
            return self.end_state_hash
        return canonical_hash([self.end_state, "answer", self.answer])


class StoredTask(BaseModel):
    task: Task
    reference: Reference | None = None  # None for original tasks
    signature: str = ""  # canonical operation sequence of the reference
    synthesizer: str = ""
    confidence: float = 1.0
    job_id: str = ""
    exploration_id: str = ""
    created_at: float = Field(default_factory=time.time)


def canonical_hash(value: Any, size: int = 16) -> str:
    blob = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:size]
