"""The `judge` section of a run's YAML."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from common.llm import LLMRoleConfig
from common.service import ServiceSettings
from judge.structured import answer_tokens


class JudgeSettings(ServiceSettings):
    port: int = Field(default=8005, ge=0, le=65535)
    llm: LLMRoleConfig | None = Field(default=None, description="the judge LLM role (hosted API, vLLM, llm_server)")
    labeller: Literal["llm", "reference_rule"] = Field(default="llm", description=(
        "reference_rule: a synthetic task's steps are labelled by a rule against its verified reference, fetched "
        "from task_manager_url (no LLM); trajectories without a reference still go to the LLM"))
    reference: bool = Field(default=False, description=(
        "the LLM judge reads a synthetic task's verified reference (fetched from task_manager_url) in its prompt; "
        "its reasons are then withheld from the response"))
    task_manager_url: str | None = Field(default=None, description=(
        "where references are fetched by task_id (the launcher fills it in); needed by labeller reference_rule "
        "and reference: true"))
    success_threshold: float = Field(default=0.5, description="an outcome above this counts as success")
    max_step_chars: int = Field(default=2000, ge=50, description="each action and observation is cut to this")
    max_query_chars: int = Field(default=4000, ge=50)
    retries: int = Field(default=1, ge=0, le=5, description="extra LLM calls when the output is unparsable")
    max_concurrency: int = Field(default=8, ge=1, description="trajectories judged at the same time")
    max_batch: int = Field(default=1024, ge=1, description="most trajectories in one request")
    cache_size: int = Field(default=4096, ge=0, description="judgments kept by content hash; 0 turns the cache off")
    max_analysis_chars: int = Field(default=200, ge=0, le=2000, description=(
        "longest analysis per step (0: judgments only); shortened for long trajectories so that their answer "
        "fits max_output_tokens"))
    max_output_tokens: int = Field(default=2048, ge=1, description=(
        "cap on one answer's tokens; below it the budget is the answer's worst-case length for the trajectory's "
        "step count, so a constrained answer is never cut. The prompt plus that budget must fit the judge "
        "model's context (an endpoint refuses the call otherwise, and the trajectory falls back)"))
    max_steps: int = Field(default=32, ge=1, description=(
        "the longest trajectory whose every step gets a parsed label: its judgments-only answer must fit "
        "max_output_tokens (and llm.max_tokens), checked at start. A longer one is labelled as far as the cap "
        "reaches and the rest is filled from the outcome"))
    temperature: float = Field(default=0.0, ge=0, description="used unless the llm role sets its own")
    audit_log: str | None = Field(default="runs/judge/audit.jsonl",
                                  description="JSONL file with one line per judged trajectory; null: off")
    audit_output_chars: int = Field(default=4000, ge=0, description="raw LLM output kept per attempt in the audit")

    @property
    def output_cap(self) -> int:
        """The tightest of max_output_tokens and the LLM role's own max_tokens."""
        role = self.llm.max_tokens if self.llm is not None else None
        return min(self.max_output_tokens, role) if role is not None else self.max_output_tokens

    @property
    def uses_references(self) -> bool:
        return self.labeller == "reference_rule" or self.reference

    @model_validator(mode="after")
    def _references_reachable(self) -> JudgeSettings:
        if self.uses_references and not self.task_manager_url:
            what = "labeller: reference_rule" if self.labeller == "reference_rule" else "reference: true"
            raise ValueError(f"{what} fetches references from the task manager: set task_manager_url")
        if self.labeller == "reference_rule" and self.reference:
            raise ValueError("reference: true has no effect with labeller: reference_rule (the rule labels every "
                             "trajectory that has a reference); choose one")
        return self

    @model_validator(mode="after")
    def _longest_answer_fits(self) -> JudgeSettings:
        need = answer_tokens(self.max_steps, 0)
        if self.output_cap < need:
            key = "max_output_tokens" if self.output_cap == self.max_output_tokens else "llm.max_tokens"
            raise ValueError(f"{key} ({self.output_cap}) is below the {need} tokens that per-step judgments for "
                             f"max_steps ({self.max_steps}) steps can take: raise {key} to at least {need} or "
                             f"lower max_steps")
        return self
