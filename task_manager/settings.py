"""Settings of the task manager: the `task_manager` section of the run YAML.

    task_manager:
      env_url: http://127.0.0.1:8080      # the environment service
      experience_url: null                 # the experience manager that pool seeding writes to (the launcher sets it)
      store_dir: runs/task_manager         # task store (SQLite): a restart continues from it
      environments: [flights]              # environments whose tasks are served and synthesized
      profiles: {flights: task_manager/profiles/flights.json}   # optional; else derived from the env
      llm:                                 # optional LLM roles; none -> random explorer + hindsight
        explorer: {base_url: http://127.0.0.1:8001/v1, model: smollm2}
        synthesizer: {base_url: ..., model: ...}
        judge: {base_url: ..., model: ...}
      explore: {breadth_steps: 6, depth_steps: 10, window: 3, breadth_temperature: 1.0, depth_temperature: 0.4}
      synthesis: {max_goals: 4, max_repairs: 4, min_confidence: 0.0, max_tokens: 512, kinds: [goal, lookup],
                  lookup_kinds: train}              # lookups of the kinds and forms the env's train tasks ask
      dedup: {threshold: 0.95, contamination_threshold: 0.9, heldout_splits: [validation, test]}
      mixture: {synthetic_ratio: 0.5, use_original: true}
      curriculum: {enabled: true, low: 0.2, high: 0.8, window: 8, outside_weight: 0.25, unsolved_after: 32}
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from common.config import StrictModel
from common.llm import LLMRoleConfig
from common.service import ServiceSettings

ExplorerKind = Literal["auto", "random", "llm"]
SynthesizerKind = Literal["auto", "hindsight", "llm"]


class LLMRoles(StrictModel):
    explorer: LLMRoleConfig | None = None
    synthesizer: LLMRoleConfig | None = None
    judge: LLMRoleConfig | None = None


class ExploreSettings(StrictModel):
    explorer: ExplorerKind = "auto"  # auto: the LLM explorer when llm.explorer is set, else random
    breadth_steps: int = Field(default=6, ge=0, le=200)
    depth_steps: int = Field(default=10, ge=0, le=200)
    window: int = Field(default=3, ge=1, le=50)  # k: observations the depth phase conditions on
    breadth_temperature: float = Field(default=1.0, gt=0)
    depth_temperature: float = Field(default=0.4, gt=0)
    max_tokens: int = Field(default=128, ge=1)  # per LLM-explorer action
    concurrency: int = Field(default=4, ge=1, le=64)  # episodes explored at once


class SynthesisSettings(StrictModel):
    synthesizer: SynthesizerKind = "auto"  # auto: LLM when llm.synthesizer is set, else hindsight
    max_goals: int = Field(default=4, ge=1)  # hindsight goals per exploration
    max_repairs: int = Field(default=4, ge=0)  # hindsight: read actions added back while minimizing
    # Hindsight query forms: `ids` spells out the reference's arguments (the easy curriculum stage); `names`
    # describes them as the environment's own tasks do (names, routes, times), so the agent looks the ids up.
    query_forms: list[Literal["ids", "names"]] = Field(default_factory=lambda: ["ids"], min_length=1)
    # What to synthesize: `goal` (the synthesizer's tasks: hindsight goals or the LLM's), `lookup` (questions
    # answered in text, from the exploration's read calls and the profile's `lookups`) and/or `multicall` (the
    # profile's multi-call `tasks`, such as book the cheapest flight or rebook, from the observed changes).
    kinds: list[Literal["goal", "lookup", "multicall"]] = Field(default_factory=lambda: ["goal"], min_length=1)
    max_lookups: int = Field(default=6, ge=1)  # lookup records asked about per exploration (each in every form)
    max_multicall: int = Field(default=4, ge=1, description=(
        "multicall -- runs of observed changes written as tasks per exploration and kind (each in every form)"))
    lookup_kinds: Literal["profile", "train"] = Field(default="profile", description=(
        "which lookups and multi-call tasks to write: profile, every kind of the profile in each of query_forms; "
        "train, only the (kind, form) pairs whose query template writes the query of one of the environment's "
        "train tasks, so self-questioning asks what the environment asks, as it asks it"))
    train_queries: int = Field(default=100, ge=1, description="lookup_kinds: train -- the train tasks read")
    min_confidence: float = Field(default=0.0, ge=0, le=1)
    max_tokens: int = Field(default=512, ge=1)
    temperature: float = Field(default=0.7, ge=0)


class DedupSettings(StrictModel):
    threshold: float = Field(default=0.95, gt=0, le=1)
    contamination_threshold: float = Field(default=0.9, gt=0, le=1)
    heldout_splits: list[Literal["validation", "test"]] = Field(default_factory=lambda: ["validation", "test"])
    max_heldout: int = Field(default=200, ge=0)  # held-out queries read per environment
    embeddings: bool = True  # MiniLM cosine; off: text and reference checks only


class MixtureSettings(StrictModel):
    synthetic_ratio: float = Field(default=0.5, ge=0, le=1)  # fraction of a batch that is synthetic
    use_original: bool = True
    # Share of the synthetic tasks (grouped by what their demonstration gives away: a lookup's answer) kept for
    # the experience pool: pool seeding uses only them and batches never sample them. 0: one set does both, so
    # a task's own demonstration can hold its answer and copying it is rewarded (issue #14's first full run).
    pool_share: float = Field(default=0.0, ge=0, lt=1)


class CurriculumSettings(StrictModel):
    enabled: bool = True
    low: float = Field(default=0.2, ge=0, le=1)
    high: float = Field(default=0.8, ge=0, le=1)
    window: int = Field(default=8, ge=1)  # recent outcomes kept per task
    outside_weight: float = Field(default=0.25, ge=0)  # sampling weight of tasks outside the band
    unseen_weight: float = Field(default=1.0, ge=0)  # tasks with no feedback yet
    by_kind: bool = False  # a task with no feedback yet is weighted by its kind's pass rate (lookup kind / goal)
    unsolved_after: int = Field(default=32, ge=0, description=(
        "a task kind no rollout has solved in this many tries (with or without a demonstration) weighs "
        "unsolved_weight; 0: off"))
    unsolved_weight: float = Field(default=0.05, ge=0, description="the sampling weight of an unsolved kind's tasks")

    @model_validator(mode="after")
    def _band(self) -> CurriculumSettings:
        if self.low > self.high:
            raise ValueError(f"curriculum.low ({self.low}) must not exceed curriculum.high ({self.high})")
        return self


class TaskManagerSettings(ServiceSettings):
    port: int = Field(default=8030, ge=0, le=65535)
    env_url: str = "http://127.0.0.1:8080"
    # Pool seeding sends replayed references here and nowhere else: a caller cannot name another URL.
    experience_url: str | None = Field(default=None, pattern=r"^https?://")
    store_dir: str = "runs/task_manager"
    environments: list[str] = Field(default_factory=lambda: ["flights"], min_length=1)
    profiles: dict[str, str] = Field(default_factory=dict)  # env -> AgentEvolver-shape profile JSON file
    error_pattern: str = r"(^|\n|-> )\s*(Error|ERROR)\b"  # an observation matching it is a failed step
    volatile_state_keys: list[str] = Field(
        default_factory=lambda: ["created_at", "updated_at", "timestamp", "time", "instance_id", "task_id"])
    llm: LLMRoles = Field(default_factory=LLMRoles)
    explore: ExploreSettings = Field(default_factory=ExploreSettings)
    synthesis: SynthesisSettings = Field(default_factory=SynthesisSettings)
    dedup: DedupSettings = Field(default_factory=DedupSettings)
    mixture: MixtureSettings = Field(default_factory=MixtureSettings)
    curriculum: CurriculumSettings = Field(default_factory=CurriculumSettings)
    max_episodes_per_job: int = Field(default=10_000, ge=1)
    serve_training_references: bool = Field(default=False, description=(
        "POST /v1/training_references: the trainable synthetic tasks solved by their replayed references, for the "
        "trainer's warm start (trainer.warm_start, source: synthetic; the launcher turns it on then). Off, the "
        "route answers 403: references then reach only the experience pool and the judge"))
