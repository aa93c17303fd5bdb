"""The `trainer` section of a run's YAML, validated at start (unknown keys fail with their path)."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from common.addresses import is_loopback
from common.config import StrictModel
from engine.device import DEVICE_PATTERN
from estimators import STEP_CREDIT_ESTIMATORS, AdvantageConfig
from trainer.settings import (
    AgentConfig,
    CollapseSettings,
    LoraSettings,
    OptimConfig,
    PolicyLossConfig,
    RolloutConfig,
    WarmStartConfig,
)


def uploads_weights(transfer: str, base_url: str) -> bool:
    """Whether new weights travel to the policy server as the request body (a server on another node shares no
    folder with the trainer) rather than as a path: `http`, or `auto` with a server off loopback."""
    return transfer == "http" or (transfer == "auto" and not is_loopback(urlsplit(base_url).hostname or ""))


class PolicyConfig(StrictModel):
    kind: Literal["in_process", "endpoint"] = "in_process"
    url: str | None = Field(default=None, description="endpoint base URL (llm_server or vLLM)")
    served_model: str = Field(default="policy", description="the `model` field sent to the endpoint")
    api_key_env: str | None = Field(default=None, description="environment variable holding the endpoint's key")
    weights_transfer: Literal["auto", "path", "http"] = Field(default="auto", description=(
        "endpoint: how new weights reach llm_server. path: a file in a folder both read (one machine); http: "
        "the file as the body of POST /v1/weights/upload (another node); auto: http unless the url's host is a "
        "loopback address"))
    max_batch: int = Field(default=32, ge=1, description="in-process: rows generated together")
    threads: int | None = Field(default=None, ge=1, description="in-process: torch threads of the engine")
    prefix_cache_mb: int = Field(default=1024, ge=0, description=(
        "in-process: MiB of finished rows' caches kept for the episode's next turn, which then prefills only "
        "its new tokens (an observation) instead of the whole conversation; 0: off"))
    dtype: Literal["auto", "float32", "bfloat16"] = Field(default="auto", description=(
        "in-process: the engine's weights; auto: bfloat16 on a CPU that computes it natively (avx512_bf16 or "
        "AMX), else the training dtype. bf16 rollout log-probs are not the update's numerics, so the update "
        "recomputes old log-probs instead of reusing them"))

    @model_validator(mode="after")
    def _endpoint_has_url(self) -> PolicyConfig:
        if self.kind == "endpoint" and not self.url:
            raise ValueError("policy.kind=endpoint needs policy.url (the server's base URL)")
        return self


class ServicesConfig(StrictModel):
    env_url: str | None = Field(default=None, description=(
        "the environment service base URL (not needed by an agent run whose agent brings its own tools)"))
    experience_url: str | None = Field(default=None, description="experience manager (self-navigating)")
    task_url: str | None = Field(default=None, description="task manager (self-questioning): training batches")
    judge_url: str | None = Field(default=None, description="judge service (self-attributing): step labels")
    timeout_s: float = Field(default=120.0, gt=0)
    outage_budget_s: float = Field(default=120.0, ge=0, description=(
        "how long a call waits for a peer that is unreachable or answers 503 (probing its /healthz) before "
        "the run fails naming it; 0: no waiting"))
    judge_fallback_after_s: float = Field(default=30.0, ge=0, description=(
        "the judge down this long: that batch is labelled by the outcome's sign (counted in judge/fallbacks)"))
    logs_dir: str | None = Field(default=None, description="where the launcher logs each peer (<name>.log); "
                                                           "named in outage errors (the launcher fills it)")


class ExperienceConfig(StrictModel):
    workspace: str = Field(default="default", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    top_k: int | None = Field(default=None, ge=1, description="None: the service's default")
    min_similarity: float | None = Field(default=None, description="None: the service's calibrated threshold")
    summarize: bool = Field(default=True, description="send each step's trajectories to be distilled")
    summarize_mode: Literal["auto", "llm", "heuristic"] | None = None
    feedback: bool = Field(default=True, description="usage feedback: reward and the no-experience baseline")
    inject: Literal["text", "turns"] = Field(default="text", description=(
        "text: the rendered experiences inside <EXP> in the task's user message; turns: the top hit's "
        "demonstration (a solved task's chat turns) before the task, falling back to text for hits without "
        "one. Either way only generation sees it: the training sample is rendered without it"))
    demonstration_observation_tokens: int = Field(default=96, ge=1, description=(
        "inject: turns -- a demonstration must leave room for the episode (max_new_tokens per turn it shows, "
        "and observations as long as its own between them); when it does not fit whole each of its "
        "observations is cut to this many "
        "tokens (the calls stay whole), and when it still does not fit the rollout goes without it (both "
        "counted in the summary)"))
    mode: Literal["group_start", "action", "step"] = Field(default="group_start", description=(
        "how experience reaches a rollout. group_start: one retrieval per task group, injected into "
        "round(n * rollout.experience_ratio) rollouts and stripped from the training sample; action: the "
        "policy asks the pool itself (a reserved tool or EvolveR's tag), the answer stays in the context with "
        "loss mask 0; step: a retrieval before every turn keyed on the task and the latest observation, kept "
        "in the context with loss mask 0"))
    ask_budget: int = Field(default=2, ge=0, description=(
        "mode: action -- answered asks per episode; an ask over it gets an observation saying so. Asks are "
        "generation turns on top of rollout.max_turns environment steps"))
    ask_format: Literal["auto", "tool", "tag"] = Field(default="auto", description=(
        "mode: action -- how the policy asks. tool: search_experience(query='...') listed with the "
        "environment's tools; tag: <search_experience>query</search_experience>; auto: tool when the chat "
        "template renders a tools list, else tag"))
    # The credit of an ask.
    ask_reward: Literal["none", "paired_branch"] = Field(default="none", description=(
        "mode: action -- none: an ask earns nothing of its own; paired_branch: for a sampled share of the "
        "rollouts that asked, the trainer continues the same prefix with the first ask's answer withheld (same "
        "environment state, same sampling seeds) and the outcome difference (with the answer - without) "
        "becomes the asking step's reward through the step-level estimators (adca_grpo, gigpo)"))
    branch_share: float = Field(default=0.5, ge=0, le=1, description=(
        "ask_reward: paired_branch -- the share of the rollouts that asked that get a branch (sampled by seed, "
        "the same in a rerun); each branch costs about one more episode from the ask on"))
    branch_state: Literal["auto", "fork", "replay"] = Field(default="auto", description=(
        "ask_reward: paired_branch -- how a branch reaches the state the ask saw. fork: a copy of the instance "
        "made at the ask (environments that declare fork); replay: the recorded actions replayed on a fresh "
        "instance (environments that declare deterministic); auto: fork where it can, else replay. An "
        "environment that can do neither is refused when the trainer starts"))


class TaskSourceConfig(StrictModel):
    synthetic_ratio: float | None = Field(default=None, ge=0, le=1, description="None: the service's mixture")
    feedback: bool = Field(default=True, description="report pass rates to the curriculum")


class EvalConfig(StrictModel):
    every: int = Field(default=0, ge=0, description="evaluate every N steps (0: only before and after)")
    before: bool = True
    after_warm_start: bool | None = Field(default=None, description=(
        "evaluate right after trainer.warm_start, before the first RL step (labelled warm_start in the summary, "
        "which then splits the change into the warm start's and RL's); None: when `before` is on. Only with "
        "warm_start.enabled"))
    after: bool = True
    split: Literal["train", "validation", "test"] = "validation"
    tasks: int = Field(default=64, ge=1, description=(
        "held-out tasks (the first N of the split; an agent run's agent.eval_tasks file instead, when given)"))
    k: int = Field(default=1, ge=1)
    greedy: bool = Field(default=True, description=(
        "temperature 0; false: sampled at rollout.temperature (in an agent run the gateway forces it on every call "
        "of a held-out episode, whatever the agent asks for)"))
    max_batch: int | None = Field(default=None, ge=1, description=(
        "in-process: rows generated together while evaluating, by an engine built for the evaluation and closed "
        "after it (None: the rollout engine's policy.max_batch); as many episodes run at once (at least "
        "rollout.concurrency). Only the speed changes: each sample is seeded"))
    asks: bool = Field(default=False, description=(
        "experience.mode action or step: also evaluate with the policy's asks (or step retrievals) on, against "
        "the run's pool, reported as eval_asks/* beside the plain eval/*; the pool is checked to hold no "
        "experience distilled from an evaluated task"))


class CheckpointConfig(StrictModel):
    every: int = Field(default=0, ge=0, description="save every N steps (0: never)")
    keep: int = Field(default=2, ge=1, description="checkpoints kept on disk")


class RayConfig(StrictModel):
    enabled: bool = True
    address: str | None = Field(default=None, description="an existing cluster; None starts a local one")
    dashboard: bool = True
    dashboard_port: int = Field(default=8265, ge=0, le=65535)
    num_cpus: float = Field(default=1.0, ge=0, description="CPUs the trainer actor reserves")
    resources: dict[str, float] = Field(default_factory=dict, description=(
        "custom Ray resources the trainer actor needs, e.g. {trainer_node: 1}: it runs on a node offering them"))
    node_labels: dict[str, str] = Field(default_factory=dict, description=(
        "run the trainer actor only on a node with these labels, e.g. {evolver/role: gpu}"))


class TrainerConfig(StrictModel):
    model: str = Field(default="smollm2", description="smollm2, tiny, or a local HF directory")
    device: str = Field(default="auto", pattern=DEVICE_PATTERN, description=(
        "auto (cuda when torch, or the Ray cluster, has a GPU; the log says which it took), cpu, cuda, cuda:1 "
        "(an index only with ray.enabled: false); cuda without a GPU fails at start"))
    seed: int = 0
    steps: int = Field(default=10, ge=0, description="RL steps; 0 only with warm_start (the warm start alone)")
    tasks_per_step: int = Field(default=4, ge=1, description="task groups per training step")
    empty_step_retries: int = Field(default=3, ge=0, description=(
        "a step whose groups were all dropped is collected again this many times, then the run fails"))
    train_split: Literal["train", "validation", "test"] = "train"
    output_dir: str = "runs/trainer"
    resume: bool = Field(default=False, description="continue from the last checkpoint in output_dir")
    export_dir: str | None = Field(default=None, description="write the final policy here as an HF directory")
    torch_threads: int | None = Field(default=None, ge=1)
    progress: bool = True
    overlap: bool = Field(default=False, description=(
        "generate the next step's rollouts while this step updates: samples are at most one policy version "
        "stale and importance-corrected (loss.importance_cap); the curriculum and experience feedback of a "
        "step then reach the batch after next (one step of lag)"))
    tensorboard: bool = True
    plot: bool = True
    rollout: RolloutConfig
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    lora: LoraSettings | None = Field(default=None, description="train LoRA adapters (peft) instead of all weights; "
                                                                 "checkpoints and exports hold the merged weights")
    loss: PolicyLossConfig = Field(default_factory=PolicyLossConfig)
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    services: ServicesConfig
    experience: ExperienceConfig = Field(default_factory=ExperienceConfig)
    tasks: TaskSourceConfig = Field(default_factory=TaskSourceConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    collapse: CollapseSettings = Field(default_factory=CollapseSettings, description=(
        "collapse detectors on the rollouts without injected experience: a collapsed run stops with exit 4"))
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    agent: AgentConfig | None = Field(default=None, description=(
        "train an agent the user already has: it calls the policy through the gateway (policy.url, kind "
        "endpoint) and `trainer.agents` runs it rollout.n times per task (see 'Train your own agent')"))

    @model_validator(mode="after")
    def _peers_for_mechanisms(self) -> TrainerConfig:
        if self.agent is None and not self.services.env_url:
            raise ValueError("services.env_url is required (the environment service), except for an agent run")
        if self.agent is not None:
            if self.policy.kind != "endpoint":
                raise ValueError("trainer.agent calls the policy through the gateway: set policy.kind: endpoint and "
                                 "policy.url to the llm_server that serves it")
            if self.agent.env is not None and not self.services.env_url:
                raise ValueError(f"agent.env={self.agent.env} creates an instance per episode: set services.env_url")
            if self.overlap or self.experience.mode != "group_start":
                raise ValueError("trainer.agent runs without overlap and experience.mode action/step (they drive "
                                 "evolver's own agent loop): turn them off")
            if self.agent.questioning is not None and not self.services.task_url:
                raise ValueError("agent.questioning synthesizes through the task manager: set services.task_url")
            if self.warm_start.enabled and (self.agent.questioning is None or self.warm_start.source != "synthetic"
                                            or self.warm_start.from_checkpoint):
                raise ValueError("trainer.agent warm-starts only on the synthetic tasks its own runs reached: set "
                                 "agent.questioning and warm_start.source: synthetic (no from_checkpoint), or turn "
                                 "warm_start off")
        if self.advantage.needs_step_labels and not self.services.judge_url:
            raise ValueError(f"advantage.estimator={self.advantage.estimator} needs step labels: set "
                             "services.judge_url (the judge service), or use an estimator without them (grpo, gigpo)")
        if self.steps == 0 and not self.warm_start.enabled:
            raise ValueError("steps: 0 trains nothing; give steps >= 1, or enable warm_start (the warm start alone)")
        if (self.warm_start.enabled and self.warm_start.source == "synthetic" and not self.warm_start.from_checkpoint
                and not self.services.task_url):
            raise ValueError("warm_start.source=synthetic fine-tunes on the task manager's synthetic tasks: set "
                             "services.task_url, or use warm_start.source: environment")
        if self.eval.after_warm_start and not self.warm_start.enabled:
            raise ValueError("eval.after_warm_start: true evaluates after the warm start, which is off: enable "
                             "warm_start, or drop eval.after_warm_start")
        if self.rollout.experience_ratio > 0 and not self.services.experience_url:
            raise ValueError("rollout.experience_ratio > 0 needs services.experience_url (the experience manager)")
        mode = self.experience.mode
        if mode != "group_start" and not self.services.experience_url:
            raise ValueError(f"experience.mode={mode} searches the pool: set services.experience_url (the "
                             "experience manager)")
        if mode != "group_start" and self.rollout.experience_ratio > 0:
            raise ValueError(f"experience.mode={mode} replaces the group-start injection: set "
                             "rollout.experience_ratio to 0 (or use experience.mode: group_start)")
        if self.eval.asks and mode == "group_start":
            raise ValueError("eval.asks evaluates with the policy's asks or step retrievals: set experience.mode "
                             "to action or step")
        if self.experience.ask_reward == "paired_branch":
            if mode != "action":
                raise ValueError(f"experience.ask_reward=paired_branch credits the policy's asks: set "
                                 f"experience.mode to action (it is {mode})")
            if self.advantage.estimator not in STEP_CREDIT_ESTIMATORS:
                raise ValueError(f"experience.ask_reward=paired_branch puts the branch's outcome difference on the "
                                 f"asking step's reward, which only the step-level estimators read "
                                 f"({', '.join(STEP_CREDIT_ESTIMATORS)}); advantage.estimator="
                                 f"{self.advantage.estimator} has no steps: choose one of them, or ask_reward: none")
        return self

    @property
    def evaluates_after_warm_start(self) -> bool:
        """Whether the held-out evaluation runs between the warm start and the first RL step."""
        if not self.warm_start.enabled:
            return False
        return self.eval.before if self.eval.after_warm_start is None else self.eval.after_warm_start
