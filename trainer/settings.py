"""The trainer's settings models that the launcher validates: rollout, optimizer, loss (no torch here).

They live apart from the code that uses them (`rollout.py`, `update.py`, `loss.py` import torch or the
tokenizer stack) so `python launcher.py` can validate a whole run without importing torch.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from common.config import StrictModel


class RolloutConfig(StrictModel):
    env: str = Field(min_length=1, description="environment name on the env service")
    template: Literal["linear", "linear_think", "sliding_window", "self_managed"] = "linear"
    template_options: dict[str, Any] = Field(default_factory=dict, description="e.g. {window: 3}")
    n: int = Field(default=8, ge=1, description="rollouts per task (one GRPO group)")
    max_turns: int = Field(default=8, ge=1)
    max_context: int = Field(default=2048, ge=16, description="tokens the policy may see, prompt included")
    max_new_tokens: int = Field(default=128, ge=1, description="per turn")
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    experience_ratio: float = Field(default=0.0, ge=0, le=1, description="eta: share of a group given experience")
    retries: int = Field(default=2, ge=0, description="extra attempts for a failed rollout")
    concurrency: int = Field(default=32, ge=1, description="episodes in flight at once")
    evaluate_params: dict[str, Any] = Field(default_factory=dict, description="params of the env evaluate call")


class OptimConfig(StrictModel):
    lr: float = Field(default=1e-6, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = Field(default=0, ge=0, description="optimizer steps of linear warm-up")
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    grad_clip: float = Field(default=1.0, gt=0)
    epochs: int = Field(default=1, ge=1, description="passes over each batch")
    minibatches: int = Field(default=2, ge=1, description="optimizer steps per pass")
    micro_batch_size: int = Field(default=4, ge=1, description="samples per forward (gradient accumulation)")
    logits: Literal["response", "full"] = Field(
        default="response", description="vocabulary projection only where a trained token is predicted, or everywhere")
    bucket_by_length: bool = Field(default=True, description="cut micro-batches from length-sorted minibatches")
    share_prompts: bool = Field(default=True, description=(
        "the completions of one prompt share one forward of it (KV cache with gradient), in one minibatch"))
    pack: bool = Field(default=True, description=(
        "a micro-batch runs as one padding-free sequence (block attention mask), its shared prompts once"))
    pack_max_tokens: int = Field(default=1024, ge=1, description=(
        "pack only micro-batches whose packed sequence is at most this long: attention over a packed sequence "
        "costs its length squared (masked blocks included), and the mask is held per layer for the backward"))
    dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="forward autocast dtype (master weights and optimizer stay fp32)")
    fuse_old_logprobs: bool = Field(default=True, description=(
        "the first minibatch's old log-probs are its own training forward's (the policy has not moved yet), "
        "so only the other minibatches need a forward before the update; off when the model has dropout"))
    reuse_rollout_logprobs: bool = Field(
        default=True, description="old log-probs from the rollout when policy version, context and numerics match")
    skip_zero_advantage: bool = Field(default=True, description=(
        "skip an update whose gradient is 0 (every trained token's advantage 0, no entropy term, and no KL term "
        "or a policy still equal to its reference): no forward, backward, optimizer or LR-schedule step "
        "(AdamW's momentum and weight decay would still have moved the weights); logged as update/skipped"))


class LoraSettings(StrictModel):
    r: int = Field(default=16, ge=1, description="adapter rank")
    alpha: float = Field(default=32.0, gt=0, description="scale: the update is alpha / r * B @ A")
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = Field(
        default="all-linear", description="module names to adapt; all-linear: every linear layer but the output head")


class PolicyLossConfig(StrictModel):
    clip_low: float = Field(default=0.2, ge=0)
    clip_high: float = Field(default=0.28, ge=0)
    clip_high_boosted: float = Field(default=0.6, ge=0)
    dual_clip_c: float = Field(default=3.0, gt=1.0, description="bound on the loss of negative-advantage tokens")
    kl_coef: float = Field(default=0.0, ge=0, description="low-variance (k3) KL to the frozen reference")
    entropy_coef: float = Field(default=0.0, ge=0)
    importance_cap: float = Field(default=2.0, gt=0, description=(
        "off-policy samples (trainer.overlap): truncation of the importance weight pi_prox / mu of the "
        "policy the update starts from against the one that generated the token"))


class CollapseSettings(StrictModel):
    """When a run has collapsed: each step's rollouts without injected experience against the first judged step's.

    A signal breaches when it reaches its threshold; `consecutive` judged steps in a row breaching the same
    signal stop the run (the trainer exits 4, and the launcher does not restart it).
    """

    enabled: bool = Field(default=True, description="judge every step and stop a collapsed run")
    min_rollouts: int = Field(default=4, ge=1, description=(
        "rollouts without injected experience a step needs to be judged; the first step with that many is the "
        "baseline. A step with fewer is not judged and leaves the counts of consecutive breaches as they were"))
    consecutive: int = Field(default=2, ge=1, description="judged steps in a row breaching one signal that stop the run")
    empty_reply_rise: float = Field(default=0.3, gt=0, le=1, description=(
        "empty_replies breaches when the share of blank replies is at least this much above the baseline's"))
    invalid_action_rise: float = Field(default=0.2, gt=0, le=1, description=(
        "invalid_actions breaches when the share of steps the environment called invalid is at least this much "
        "above the baseline's"))
    reply_length_shrink: float = Field(default=0.3, gt=0, le=1, description=(
        "short_replies breaches when the median reply (policy tokens of one turn) is at most this share of the "
        "baseline's median"))
    reply_length_bloat: float = Field(default=3.0, ge=1, description=(
        "long_replies breaches when the median reply is at least this multiple of the baseline's median "
        "(replies are capped at rollout.max_new_tokens: a baseline near the cap cannot bloat that far)"))


class WarmStartConfig(StrictModel):
    """Supervised fine-tuning of the policy on solved tasks before the first RL step."""

    enabled: bool = Field(default=False, description="fine-tune on references before RL")
    source: Literal["synthetic", "environment"] = Field(default="synthetic", description=(
        "synthetic: the task manager's trainable synthetic tasks (what batches sample; never the pool's share, "
        "never one grown from a held-out task), their verified references replayed (needs services.task_url and "
        "task_manager.serve_training_references, which the launcher sets); environment: the environment's own train "
        "tasks' references (env service GET /v1/environments/{env}/tasks/{id}/reference), for comparison"))
    max_tasks: int | None = Field(default=None, ge=1, description="use at most this many solved tasks (None: all)")
    epochs: int = Field(default=2, ge=1, description="passes over the solved tasks")
    batch_size: int = Field(default=4, ge=1, description="solved tasks per optimizer step")
    lr: float = Field(default=3e-5, gt=0, description="AdamW peak learning rate")
    schedule: Literal["constant", "cosine", "linear"] = Field(default="cosine", description="decay over all steps")
    warmup_steps: int = Field(default=0, ge=0, description="optimizer steps of linear warm-up")
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip: float = Field(default=1.0, gt=0, description="max gradient norm per step")
    share_opening: bool = Field(default=True, description=(
        "a batch's common opening (the system prompt and tool list every sample starts with) runs once and "
        "rows of similar length continue its cache together, instead of one forward per sample: the same "
        "gradient up to rounding, fewer tokens computed"))
    dtype: Literal["float32", "bfloat16"] = Field(default="float32", description=(
        "the forwards' autocast dtype (weights, gradients and AdamW stay fp32): bfloat16 runs the matmuls on the "
        "CPU's bf16 units (AMX, avx512_bf16), other rounding than fp32 (docs/performance.md)"))
    from_checkpoint: str | None = Field(default=None, description=(
        "a checkpoint an earlier warm-started run saved before its first RL step (its `step_000000.pt`): its "
        "weights and warm-start report are loaded instead of fine-tuning again, so several runs share one warm "
        "start (the ablation's W rows); the weights' digest is checked against the report's"))


class AgentQuestioningConfig(StrictModel):
    """`trainer.agent.questioning`: tasks synthesized from the agent's own tool calls before RL
    (`trainer.agent_questioning`); needs `agent.env` (its profile says what a task is) and the task manager."""

    explore_tasks: int = Field(default=8, ge=1, description=(
        "explore from the first N tasks of agent.tasks (each a seed: its environment instance)"))
    explore_episodes: int = Field(default=2, ge=1, description=(
        "forced-tools episodes per explored task (off-policy: they feed synthesis, never the RL update)"))
    max_tasks: int = Field(default=64, ge=1, description=(
        "verified synthetic tasks played through the agent at most (one of each kind in turn)"))
    train_on_kept: bool = Field(default=True, description=(
        "the tasks the agent's run reached join agent.tasks for the RL steps"))
    train_on_tasks: bool = Field(default=True, description=(
        "RL trains on agent.tasks too; false: on the kept tasks only, so no RL episode is graded by a human label "
        "(agent.tasks then only seed the exploration: zero human data); needs train_on_kept"))
    job_timeout_s: float = Field(default=900.0, gt=0, description="the task manager's synthesis job must end in this")

    @model_validator(mode="after")
    def _some_rl_tasks(self) -> AgentQuestioningConfig:
        if not (self.train_on_tasks or self.train_on_kept):
            raise ValueError("agent.questioning: train_on_tasks and train_on_kept are both false, which leaves RL no "
                             "task; set train_on_kept: true to train on the kept tasks only")
        return self


class AgentConfig(StrictModel):
    """`trainer.agent`: train an agent the user already has, through the gateway (`trainer.agents`)."""

    callable: str | None = Field(default=None, description=(
        "'module:function' of `async def agent(task: dict, base_url: str) -> reward or answer`"))
    command: list[str] | None = Field(default=None, min_length=1, description=(
        "instead of `callable`: a command that reads the task as JSON on stdin, finds the base URL in "
        "OPENAI_BASE_URL and prints its answer (or {\"reward\": x}) as its last stdout line"))
    tasks: str = Field(description="JSONL file of tasks, one JSON object a line, passed to the agent as they are")
    query_field: str = Field(default="query", min_length=1, description=(
        "the task field that holds the query text (experience is retrieved by it)"))
    task_id_field: str = Field(default="task_id", min_length=1, description="the task field that names the task")
    grader: str | None = Field(default=None, description=(
        "'module:function' of `grade(task, answer) -> float` (sync or async); not needed when the agent returns "
        "its reward or when `env` grades"))
    env: str | None = Field(default=None, description=(
        "an env_service environment whose instance is created per episode (its address goes into the task under "
        "`env`) and whose evaluate grades the episode unless `grader` is set; the task id field names the "
        "environment's task"))
    eval_tasks: str | None = Field(default=None, description=(
        "JSONL file of held-out tasks for trainer.eval, shaped like `tasks` and graded like them (default with "
        "`env`: the first eval.tasks task ids of the environment's eval.split); none of them may be a training "
        "task"))
    timeout_s: float = Field(default=300.0, gt=0, description="an episode running longer fails")
    concurrency: int = Field(default=16, ge=1, description="episodes in flight at once")
    questioning: AgentQuestioningConfig | None = Field(default=None, description=(
        "before RL: explore with forced tool calls, synthesize tasks from what the tools returned, keep those the "
        "agent's run reaches (and warm-start on them with trainer.warm_start); needs env and services.task_url"))

    @model_validator(mode="after")
    def _one_agent(self) -> AgentConfig:
        if (self.callable is None) == (self.command is None):
            raise ValueError("give exactly one of agent.callable or agent.command")
        if self.questioning is not None and self.env is None:
            raise ValueError("agent.questioning synthesizes tasks from an environment's tools (its profile says what "
                             "a task is): set agent.env")
        return self
