"""Request and response bodies of the task manager's /v1 API (shared by the app and `client.py`).

Nothing the trainer calls can carry a reference solution: tasks travel as `common.schemas.Task`. The one
exception, `ReferenceResponse`, is served to the judge (reference-guided attribution), which returns only labels.
The other, `TrainingReferencesResponse` (`POST /v1/training_references`, served only with
`serve_training_references: true`), holds the replayed references of the trainable synthetic tasks: the data
of the trainer's warm start.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictInt, model_validator

from common.schemas import Task, Trajectory, WireModel

JobKind = Literal["synthesize", "explore", "observed"]


class Failures(WireModel):
    """Why attempts came to nothing: how many by reason, and the first error's text.

    One format for every piece of work that may find nothing: a self-questioning job's explorations (the
    job's progress, `GET /v1/stats`, the launcher's line), and any other producer of tasks. A reason is a
    short snake_case name (`environment_error`, `no_state_change`); one attempt may count under several."""

    by_reason: dict[str, int] = Field(default_factory=dict)
    first_error: str | None = None  # the first error text met, as the failing component wrote it

    def add(self, reason: str, error: str | None = None) -> None:
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        if error and self.first_error is None:
            self.first_error = error[:1000]

    def merge(self, other: Failures) -> None:
        for reason, count in other.by_reason.items():
            self.by_reason[reason] = self.by_reason.get(reason, 0) + count
        if self.first_error is None:
            self.first_error = other.first_error

    def total(self) -> int:
        return sum(self.by_reason.values())

    def summary(self) -> str:
        """`environment_error: 4, no_state_change: 1; first error: IndexError: ...` ('' when nothing failed)."""
        counts = ", ".join(f"{reason}: {count}" for reason, count in sorted(self.by_reason.items()))
        return counts + (f"; first error: {self.first_error}" if self.first_error else "")


class ObservedToolCall(WireModel):
    """A tool call an agent made and the result its tool gave (as a gateway saw them)."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: str


class ObservedEpisode(WireModel):
    """An agent's tool calls in one episode on an instance of `seed_task_id`, in order."""

    seed_task_id: str = Field(min_length=1)
    calls: list[ObservedToolCall] = Field(min_length=1, max_length=200)


class ArgumentValuesRequest(WireModel):
    """What a forced exploration call of the seed task's tools may take (an agent's exploration through a gateway)."""

    env: str = Field(min_length=1)
    seed_task_id: str = Field(min_length=1)


class ArgumentValuesResponse(WireModel):
    env: str
    seed_task_id: str
    # tool -> argument -> the values an episode of the task knows at its start (its request, the tool docs)
    tools: dict[str, dict[str, list[Any]]]


class JobRequest(WireModel):
    # synthesize: explore, propose, verify, dedup, store; explore: store explorations; observed: the same as
    # synthesize, its explorations the given agent episodes' tool calls (replayed for the states they reach, the
    # results the agent saw kept as the observations), one per episode.
    kind: JobKind = "synthesize"
    env: str = Field(min_length=1)
    episodes: int = Field(default=20, ge=1)
    explorer: Literal["auto", "random", "llm"] | None = None
    synthesizer: Literal["auto", "hindsight", "llm"] | None = None
    seed: int = 0  # episode e of a job explores with a generator seeded by (seed, e)
    seed_tasks: list[str] | None = None  # seed task ids (default: the environment's train split)
    breadth_steps: int | None = Field(default=None, ge=0, le=200)
    depth_steps: int | None = Field(default=None, ge=0, le=200)
    window: int | None = Field(default=None, ge=1, le=50)
    observed: list[ObservedEpisode] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _observed_episodes(self) -> JobRequest:
        if (self.kind == "observed") != (self.observed is not None):
            raise ValueError("observed: give it exactly when kind is 'observed' (the agent episodes to synthesize "
                             "from)")
        if self.observed is not None:
            self.episodes = len(self.observed)
        return self


class JobInfo(WireModel):
    job_id: str
    kind: JobKind
    status: Literal["queued", "running", "done", "failed", "cancelled"]
    params: dict[str, Any]
    cursor: int = 0  # episodes committed: a restart resumes here
    progress: dict[str, Any]
    error: str | None = None
    created_at: float
    updated_at: float


class JobList(WireModel):
    jobs: list[JobInfo]


class TaskPage(WireModel):
    tasks: list[Task]
    total: int


class TaskDetail(WireModel):
    task: Task
    pass_rate: float | None = None  # recent pass rate from trainer feedback
    rollouts: int = 0


class BatchRequest(WireModel):
    batch_size: int = Field(ge=1, le=4096)
    env: str | None = None  # default: every configured environment
    synthetic_ratio: float | None = Field(default=None, ge=0, le=1)  # default: mixture.synthetic_ratio
    seed: StrictInt | None = None  # strict: `true` is not a seed


class BatchResponse(WireModel):
    tasks: list[Task]
    original: int
    synthetic: int
    in_band: int  # tasks whose recent pass rate is inside the curriculum band
    curriculum: bool
    # Kinds down-weighted as unsolved (`curriculum.unsolved_after` tries, none solved) -> their tries.
    unsolved_kinds: dict[str, int] = Field(default_factory=dict)


class GradeRequest(WireModel):
    task_id: str = Field(min_length=1)
    # The rollout's final state snapshot (env service GET /v1/instances/{id}/state: the whole response
    # or its `state`), and/or its trajectory (for the LLM judge where there is no state, and for a lookup,
    # whose closing text reply is the answer).
    state: Any = None
    trajectory: Trajectory | None = None


class GradeResponse(WireModel):
    task_id: str
    reward: float = Field(ge=0.0, le=1.0)
    method: Literal["state_match", "llm_judge", "answer_match"]


class FeedbackItem(WireModel):
    task_id: str = Field(min_length=1)
    env_type: str | None = None  # needed only when an original task id exists in several environments
    outcomes: list[float] = Field(min_length=1, max_length=10_000)  # rewards in [0, 1] of recent rollouts


class FeedbackRequest(WireModel):
    results: list[FeedbackItem] = Field(min_length=1, max_length=100_000)
    # A report sent again with the same id (a retry after a dropped connection, a resumed run) is applied once.
    request_id: str | None = Field(default=None, min_length=1, max_length=128)


class FeedbackResponse(WireModel):
    updated: int
    idempotent_replay: bool = False  # this request_id was applied before; nothing changed now


class SeedRequest(WireModel):
    """Seed an experience pool from verified synthetic tasks (their references replayed, then summarized into
    `workspace` of the task manager's configured `experience_url`)."""

    env: str = Field(min_length=1)
    workspace: str = Field(default="default", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    # Default: every verified synthetic task of `env` grown from a train task. Named ids must all be such
    # tasks: a validation or test task (or any other) fails the whole request with 400, nothing is sent.
    task_ids: list[str] | None = Field(default=None, max_length=10_000)
    limit: int = Field(default=64, ge=1, le=10_000)
    request_id: str | None = Field(default=None, min_length=1, max_length=128)


class SeedResponse(WireModel):
    env: str
    workspace: str
    candidates: int  # synthetic tasks considered
    refused: int  # left out because they may not seed the pool (only when no ids were named)
    kept_for_training: int = 0  # left out because they are training tasks (mixture.pool_share > 0)
    replayed: int
    replay_failed: int
    sent: int  # trajectories summarized into the pool
    experiences_created: int
    experiences_updated: int
    task_ids: list[str]
    errors: list[str]


class ReferenceCall(WireModel):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ReferenceResponse(WireModel):
    """A synthetic task's verified reference, for the judge only: it labels steps with it and returns labels."""

    task_id: str
    actions: list[str]  # the reference's assistant messages, in order
    calls: list[ReferenceCall] | None = None  # the same as structured calls, when known
    answer: str | None = None  # a lookup's answer (its closing reply must state it)


class TrainingReferencesRequest(WireModel):
    """The trainable synthetic tasks of `env` solved by their verified references (the warm start's data)."""

    env: str = Field(min_length=1)
    limit: int = Field(default=10_000, ge=1, le=100_000)


class TrainingReferencesResponse(WireModel):
    env: str
    trainable: int  # synthetic tasks batches sample (grown from train tasks, not the pool's, not withheld)
    pool_held: int  # left out: they seed the experience pool (mixture.pool_share)
    withheld: int  # left out: a pool demonstration shows their answer
    refused: int  # left out: not grown from a train task, or without a verified reference
    replayed: int
    replay_failed: int  # the reference no longer reaches its verified end state
    # Each replayed in a fresh instance of its seed task started with its query, as the trainer starts it:
    # the opening [system, user] messages, then each reference action and the observation it got.
    trajectories: list[Trajectory]
