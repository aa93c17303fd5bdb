"""Wire models of the judge service (`POST /v1/judge`, `GET /v1/stats`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from common.schemas import StepLabel, WireModel


class JudgeStep(WireModel):
    action: str = Field(description="what the agent did: its message and tool calls, as text")
    observation: str | None = Field(default=None, description="what the environment answered")


class JudgeTrajectory(WireModel):
    trajectory_id: str
    task_id: str | None = None
    query: str = Field(default="", description="the task description the agent worked on")
    steps: list[JudgeStep]
    # A non-finite value is rejected by the route with a 422 naming the trajectory.
    outcome: float = Field(description="final reward; above the service's success threshold counts as success")


class JudgeRequest(WireModel):
    trajectories: list[JudgeTrajectory]


# Who labelled a trajectory: the reference rule, the LLM given the task's reference, the LLM alone, or nobody
# (no reference and no LLM configured: the outcome's sign, flagged as a fallback).
LabelSource = Literal["rule", "llm+reference", "llm", "outcome"]
MAX_REASON_CHARS = 300  # a label's reason, at most


def fallback_labels(steps: int, success: bool, why: str) -> list[StepLabel]:
    """Every step labelled with the outcome's sign: what a fallback judgment holds, and what the trainer uses
    when the judge cannot be reached."""
    fill = "GOOD" if success else "BAD"
    return [StepLabel(step=t, label=fill, reason=f"fallback to the outcome's sign: {why}"[:MAX_REASON_CHARS])
            for t in range(steps)]


class TrajectoryJudgment(WireModel):
    trajectory_id: str
    source: LabelSource = "llm"
    labels: list[StepLabel] = Field(description="exactly one label per step, in step order")
    fallback: bool = Field(default=False, description="every label is the outcome's sign: the LLM gave nothing usable")
    cached: bool = False
    parsed_labels: int = Field(default=0, description="labels read from the LLM output before any filling")
    filled_steps: list[int] = Field(default_factory=list, description="steps whose label was not read but filled")
    reconciliation: list[str] = Field(default_factory=list, description="what was done to get one label per step")
    attempts: int = Field(default=0, description="LLM calls made for this trajectory (0 when cached)")
    error: str | None = None
    structured: bool = Field(default=False, description="the answer was constrained to the label JSON schema")
    budget_cut: bool = Field(default=False, description="an answer stopped at the output token limit")
    prompt_tokens: int = 0
    completion_tokens: int = 0


class BatchUsage(WireModel):
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_hits: int = 0


class JudgeResponse(WireModel):
    judgments: list[TrajectoryJudgment]
    usage: BatchUsage
    fallback_count: int = 0
    raw_parse_rate: float = Field(default=0.0, description="labels parsed before filling / steps, this batch")


class LabelRates(WireModel):
    trajectories: int = 0
    steps: int = 0
    good: int = 0
    bad: int = 0
    good_rate: float = 0.0


class JudgeStats(WireModel):
    trajectories: int = 0
    steps: int = 0
    successful: LabelRates = Field(default_factory=LabelRates,
                                   description="labels on successful trajectories (fallbacks excluded)")
    failed: LabelRates = Field(default_factory=LabelRates,
                               description="labels on failed trajectories (fallbacks excluded)")
    fallbacks: int = 0
    fallback_rate: float = 0.0
    parsed_labels: int = 0
    raw_parse_rate: float = Field(default=0.0, description="labels parsed before filling / steps, since start")
    filled_steps: int = Field(default=0, description="steps whose label was filled (outcome's sign), fallbacks included")
    filled_rate: float = Field(default=0.0, description="filled_steps / steps")
    trajectories_with_filled: int = Field(default=0, description="LLM-judged trajectories with some missing labels")
    budget_cut_calls: int = Field(default=0, description="LLM answers cut by the output token budget")
    structured_calls: int = Field(default=0, description="LLM calls constrained by a JSON schema")
    cache_hits: int = 0
    labels_by_source: dict[str, int] = Field(default_factory=dict, description="step labels by LabelSource")
    reference_lookup_failures: int = Field(default=0, description="task manager lookups that got no answer")
    llm_calls: int = 0
    unparsable_calls: int = 0
    llm_errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
