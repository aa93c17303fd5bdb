"""Settings of the experience manager (the `experience_manager` section of the run YAML)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from common.config import StrictModel
from common.llm import LLMRoleConfig
from common.service import ServiceSettings

# Calibrated on the calibration half of fixtures/retrieval.json with all-MiniLM-L6-v2
# (`python -m experience_manager.quality --calibrate` prints these; tests check they still agree).
CALIBRATED_MIN_SIMILARITY = 0.28
CALIBRATED_LEXICAL_WEIGHT = 0.3
CALIBRATED_DEDUP_SAME = 0.63
CALIBRATED_DEDUP_MERGE = 0.52


class RetrievalSettings(StrictModel):
    top_k: int = Field(default=3, ge=1, le=50)
    # Applies to the relevance: cosine(task, when_to_use) + lexical_weight * saturated BM25.
    min_similarity: float = Field(default=CALIBRATED_MIN_SIMILARITY, ge=-1.0, le=2.0)
    lexical_weight: float = Field(default=CALIBRATED_LEXICAL_WEIGHT, ge=0.0, le=1.0)
    candidate_factor: int = Field(default=3, ge=1, le=20)
    utility_weight: float = Field(default=0.1, ge=0.0, le=1.0)
    cache_size: int = Field(default=4096, ge=0)


class DedupSettings(StrictModel):
    same_threshold: float = Field(default=CALIBRATED_DEDUP_SAME, gt=0.0, le=1.0)
    merge_threshold: float = Field(default=CALIBRATED_DEDUP_MERGE, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _ordered(self) -> DedupSettings:
        if self.merge_threshold > self.same_threshold:
            raise ValueError("dedup.merge_threshold must not exceed dedup.same_threshold")
        return self


class ScoringSettings(StrictModel):
    min_uses: int = Field(default=5, ge=1)
    advantage_margin: float = Field(default=-0.05, le=0.0)
    utility_floor: float = Field(default=0.3, ge=0.0, le=1.0)
    max_active: int = Field(default=5000, ge=1)
    auto_prune: bool = True  # apply the archive rules after every feedback


class SummarySettings(StrictModel):
    mode: Literal["auto", "llm", "heuristic"] = "auto"
    success_threshold: float = 1.0  # a trajectory with reward >= this is a success (ReMe's rule)
    max_items_per_prompt: int = Field(default=3, ge=1, le=3)
    max_trajectories: int = Field(default=512, ge=1)
    llm_max_tokens: int = Field(default=800, ge=64)
    # A successful source trajectory is kept whole with its experiences as a demonstration when it has at
    # most this many messages and characters (0 messages: keep none).
    demonstration_max_messages: int = Field(default=12, ge=0, le=64)
    demonstration_max_chars: int = Field(default=6000, ge=100, le=50_000)


class ExperienceManagerSettings(ServiceSettings):
    port: int = Field(default=8003, ge=0, le=65535)
    store: str = Field(default="runs/experience_store", description="folder for Qdrant local mode, journal, meta")
    qdrant_url: str | None = Field(default=None, description="a Qdrant server; the journal and meta stay in `store`")
    qdrant_api_key_env: str | None = None
    summarizer: LLMRoleConfig | None = None
    summary: SummarySettings = Field(default_factory=SummarySettings)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    dedup: DedupSettings = Field(default_factory=DedupSettings)
    scoring: ScoringSettings = Field(default_factory=ScoringSettings)
    upsert_batch_size: int = Field(default=64, ge=1, le=4096)
    journal_fsync: bool = True
    # Past this many records the journal is rewritten as a snapshot (0: never), so a restart reads a bounded file.
    journal_compact_records: int = Field(default=2000, ge=0)
    # Request ids whose first answer is kept for retries (the newest ones; an older id is treated as new).
    idempotency_window: int = Field(default=8192, ge=1)
    max_workspaces: int = Field(default=256, ge=1)
