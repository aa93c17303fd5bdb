"""Settings of the `llm_server` section (flags > YAML > defaults)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from common.service import ServiceSettings
from engine.device import DEVICE_PATTERN
from llm_server.protocol import DEFAULT_WEIGHTS_DIR


class LLMServerSettings(ServiceSettings):
    port: int = Field(default=8001, ge=0, le=65535)
    model: str = Field(default="smollm2", description="`smollm2`, `tiny` or a local HF model directory")
    served_model_name: str | None = Field(default=None, description="the name clients send (default: `model`)")
    device: str = Field(default="cpu", pattern=DEVICE_PATTERN, description=(
        "where the model and its KV cache live: cpu, cuda, cuda:1, or auto (cuda when torch sees a GPU); cuda "
        "without a GPU fails at start"))
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto", description="weights and KV cache; auto: bfloat16 on a GPU and where the CPU computes it "
                                    "natively (avx512_bf16 or AMX: ~1.5-2x faster decode), else float32")
    max_batch: int = Field(default=32, ge=1, description=(
        "rows (sequences) decoded together at most: a GRPO batch of 8 tasks x 4 rollouts decodes as one"))
    batch_window_ms: float = Field(default=10.0, ge=0, description="how long an idle server waits for company")
    prefix_cache_mb: int = Field(default=256, ge=0, description=(
        "MiB of finished requests' caches kept: a request that repeats one's prompt and reply and appends "
        "to them (an agent's next turn) prefills only what it appended; 0: off"))
    threads: int | None = Field(default=None, ge=1, description="torch threads (default: all cores)")
    default_max_tokens: int = Field(default=512, ge=1, description="max_tokens of a chat request that gives none")
    max_request_tokens: int = Field(default=32768, ge=1, description="limit on n * max_tokens of one request")
    weights_dir: str = Field(default=str(DEFAULT_WEIGHTS_DIR),
                             description="POST /v1/weights loads only from inside this directory (the launcher "
                                         "sets the trainer's weights folder)")
    max_weights_bytes: int = Field(default=16 * 1024**3, gt=0, description=(
        "largest weights file POST /v1/weights/upload takes: how a trainer on another node sends its weights "
        "over HTTP instead of through a shared folder"))
    grammar_cache_size: int = Field(default=256, ge=1, description="compiled structured-output grammars kept (LRU)")
    grammar_timeout_s: float = Field(default=10.0, gt=0,
                                     description="a constraint that compiles longer than this gets a 400")
    gateway_drain_timeout_s: float = Field(default=300.0, gt=0, description=(
        "a weight update waits this long for the gateway's open episodes to end, then cuts them (their later "
        "calls get 409, the runner fails them): an episode never spans two policy versions"))
