"""The `judge` section of a run's YAML."""

from __future__ import annotations

from pydantic import Field

from common.llm import LLMRoleConfig
from common.service import ServiceSettings


class JudgeSettings(ServiceSettings):
    port: int = Field(default=8005, ge=0, le=65535)
    llm: LLMRoleConfig | None = Field(default=None, description="the judge LLM role (hosted API, vLLM, llm_server)")
    success_threshold: float = Field(default=0.5, description="an outcome above this counts as success")
    max_step_chars: int = Field(default=2000, ge=50, description="each action and observation is cut to this")
    max_query_chars: int = Field(default=4000, ge=50)
    retries: int = Field(default=1, ge=0, le=5, description="extra LLM calls when the output is unparsable")
    max_concurrency: int = Field(default=8, ge=1, description="trajectories judged at the same time")
    max_batch: int = Field(default=1024, ge=1, description="most trajectories in one request")
    cache_size: int = Field(default=4096, ge=0, description="judgments kept by content hash; 0 turns the cache off")
    max_tokens_per_step: int = Field(default=96, ge=8)
    max_output_tokens: int = Field(default=2048, ge=16)
    temperature: float = Field(default=0.0, ge=0, description="used unless the llm role sets its own")
    audit_log: str | None = Field(default="runs/judge/audit.jsonl",
                                  description="JSONL file with one line per judged trajectory; null: off")
    audit_output_chars: int = Field(default=4000, ge=0, description="raw LLM output kept per attempt in the audit")
