"""Request bodies of the OpenAI-compatible routes, plus the evolver extensions.

Extensions (vLLM-style, so the trainer can train on exact tokens):
- every completion response has top-level `prompt_token_ids` and `policy_version`, and each
  choice has `token_ids` and `token_logprobs` (log_softmax of the raw logits at each sampled token);
- `/v1/completions` accepts `prompt_token_ids` (or a list of ints as `prompt`): token in, token out.
Unknown fields are ignored, as OpenAI-compatible servers do; parameters that would change the
result but are not implemented (penalties, logit bias, echo, streaming on `/v1/completions`) are refused
with a 400. Chat streams (`stream=true`) as server-sent events.
Structured outputs (`response_format`, vLLM's `structured_outputs` and `guided_*`, forced
`tool_choice`) are read and checked by `llm_server.structured`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from common.config import StrictModel

MAX_TOP_LOGPROBS = 20


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    temperature: float = Field(default=1.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM extension
    ignore_eos: bool = False  # vLLM extension: run to max_tokens (fixed-length benchmark workloads)
    n: int = Field(default=1, ge=1)
    seed: int | None = None
    stream: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    # Kept loose here so a malformed constraint is a 400 naming the problem (llm_server.structured), not a 422.
    response_format: Any = None
    structured_outputs: Any = None  # vLLM
    guided_json: Any = None  # vLLM before structured_outputs
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return tuple(s for s in stops if s)

    def unsupported(self) -> list[str]:
        """Names of parameters that were set to something this server does not implement."""
        problems = []
        if self.presence_penalty:
            problems.append("presence_penalty (only 0 is supported)")
        if self.frequency_penalty:
            problems.append("frequency_penalty (only 0 is supported)")
        if self.logit_bias:
            problems.append("logit_bias (not supported)")
        return problems


class ChatCompletionRequest(_SamplingFields):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    # vLLM extensions: render the template without the assistant header, or continue the last turn.
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    stream_options: dict[str, Any] | None = None  # {"include_usage": true}: a last chunk with the usage


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | None = None
    prompt_token_ids: list[int] | None = None
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for /v1/completions
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    best_of: int | None = None

    def unsupported(self) -> list[str]:
        problems = super().unsupported()
        if self.stream:
            problems.append("stream=true on /v1/completions (chat streams; here send stream=false)")
        return problems


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize: a text prompt, or chat messages rendered with the served chat template."""

    model_config = ConfigDict(extra="ignore")

    model: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    tokens: list[int]


# Where weights may be read from when llm_server.weights_dir is not set; the trainer's endpoint
# policy writes under it by default, so the two agree without configuration.
DEFAULT_WEIGHTS_DIR = Path(tempfile.gettempdir()) / "evolver-weights"


WEIGHTS_UPLOAD = "/v1/weights/upload"  # POST a safetensors file as the body (?policy_version=N)


class WeightUpdateRequest(StrictModel):
    path: str = Field(description="an HF/safetensors directory, or a .safetensors / .pt / .bin state-dict file, "
                                  "inside the server's weights_dir")
    policy_version: int | None = Field(default=None, ge=0,
                                       description="the version to report from now on (default: current + 1)")


class WeightUpdateResponse(BaseModel):
    policy_version: int
    loaded_tensors: int
    path: str


Role = Literal["system", "developer", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset(Role.__args__)  # type: ignore[attr-defined]


class TokenChoice(BaseModel):
    """One choice as the trainer needs it: text plus the exact tokens and their logprobs."""

    model_config = ConfigDict(extra="ignore")

    index: int
    text: str
    token_ids: list[int]
    token_logprobs: list[float]
    finish_reason: str | None = None


class TokenCompletion(BaseModel):
    model_config = ConfigDict(extra="ignore")

    prompt_token_ids: list[int]
    choices: list[TokenChoice]
    policy_version: int
    usage: dict[str, int] = Field(default_factory=dict)


# ---- the gateway: an agent's calls recorded per episode (`llm_server.gateway`) -------------------------
EPISODE_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
EPISODE_HEADER = "X-Evolver-Episode"  # the alternative to the episode in the URL


class EpisodeSampling(StrictModel):
    """Sampling the gateway applies to every call of an episode, whatever the agent's calls ask for (a held-out
    evaluation at a fixed temperature of an agent that sets its own)."""

    temperature: float | None = Field(default=None, ge=0.0, le=100.0, description="0: greedy")
    seed: int | None = Field(default=None, ge=0, description="call i of the episode samples with seed + i")


class EpisodeOpen(StrictModel):
    episode_id: str | None = Field(default=None, pattern=EPISODE_ID_PATTERN,
                                   description="the id to record under (default: a new one)")
    experience: str | None = Field(default=None, min_length=1, max_length=20000, description=(
        "text put into the system message of every call for generation only: the recorded training "
        "contexts leave it out"))
    metadata: dict[str, Any] = Field(default_factory=dict, description="kept with the record (task id, group)")
    force_tools: bool = Field(default=False, description=(
        "exploration: every call that offers tools is answered with a valid call of one of them (as with "
        "tool_choice 'required'), so the agent's tools run before the policy would call one; off-policy"))
    tool_arguments: dict[str, dict[str, list[Any]]] | None = Field(default=None, description=(
        "with force_tools: per tool and argument, the values a forced call may take (an argument listed takes one "
        "of them): grounds the calls of a model that writes no sensible argument"))
    script: list[str] | None = Field(default=None, min_length=1, description=(
        "replies given in order instead of sampling, in the model's own text format (a `<tool_call>` block for a "
        "tool call): a reference played through the agent's own code; off-policy"))
    script_results: list[str] | None = Field(default=None, description=(
        "with script: what the script's tool calls returned when the reference was recorded, in order: an id "
        "that run generated (an order number) is replaced in the later replies by the one this run's tools "
        "returned in its place"))
    sampling: EpisodeSampling | None = Field(default=None, description=(
        "the temperature (and seed) every call of the episode samples with, whatever the agent sends"))

    @model_validator(mode="after")
    def _one_mode(self) -> EpisodeOpen:
        if self.force_tools and self.script is not None:
            raise ValueError("give force_tools or script, not both: a scripted reply is not sampled")
        if self.tool_arguments is not None and not self.force_tools:
            raise ValueError("tool_arguments grounds forced calls: set force_tools too")
        if self.script_results is not None and self.script is None:
            raise ValueError("script_results carries a script's generated ids: give the script too")
        return self


EpisodeMode = Literal["policy", "forced", "scripted"]


class ObservedToolResult(BaseModel):
    """A tool call the gateway issued and the result the agent sent back for it in a later call."""

    call_index: int = Field(description="the call whose reply held the tool call")
    tool_call_id: str
    name: str
    arguments: dict[str, Any] | str = Field(description="the arguments, parsed (the raw text when not JSON)")
    result: str


class GatewayCall(BaseModel):
    """One chat call of an episode, as sampled: what the trainer trains on, token for token."""

    index: int
    prompt_ids: list[int] = Field(description="the ids the model continued (experience included)")
    train_prompt_ids: list[int] = Field(description="the same context without the experience")
    token_ids: list[int]
    logprobs: list[float]
    policy_version: int
    finish_reason: str
    content: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    messages: list[dict[str, Any]] = Field(default_factory=list, description="the messages the agent sent")
    extends: int | None = Field(default=None, description=(
        "the earlier call whose prompt and sampled ids this call's context continues, token for token"))
    glue_ids: list[int] = Field(default_factory=list, description=(
        "with `extends`: the ids between that call's sampled ids and this call's (the turn's closing, the tool "
        "results and user turns, the next assistant header): context, never trained"))


class EpisodeRecord(BaseModel):
    episode_id: str
    status: Literal["open", "ended"]
    ended_reason: str | None = None  # "ended" (by the caller) or "weight_update" (cut by the drain timeout)
    with_experience: bool = False
    # policy: sampled by the policy, what RL trains on; forced (tools forced) and scripted: off-policy.
    mode: EpisodeMode = "policy"
    sampling: EpisodeSampling | None = Field(default=None, description="the sampling forced on every call")
    observed: list[ObservedToolResult] = Field(default_factory=list, description=(
        "the tool calls of the episode's replies whose results came back in a later call, in order"))
    metadata: dict[str, Any] = Field(default_factory=dict)
    calls: list[GatewayCall] = Field(default_factory=list)
