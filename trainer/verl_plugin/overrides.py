"""Our run YAML -> veRL's Hydra overrides for `python -m verl.trainer.main_ppo`.

The run YAML keeps its `trainer` section (the same rollout, loss, advantage and optim settings the
local trainer reads) and adds a `verl` section for what only a GPU cluster has (model path, GPUs,
tensor parallelism, sequence lengths, batch sizes). Every key is mapped explicitly below; anything
else veRL offers goes in `verl.extra_overrides`, appended last so it wins.

    python -m trainer.verl_plugin overrides --conf examples/overall_gpu.yaml [--env-url URL ...]
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from common.config import StrictModel, validate
from estimators import AdvantageConfig, catalog
from trainer.config import ExperienceConfig, TaskSourceConfig
from trainer.settings import OptimConfig, PolicyLossConfig, RolloutConfig
from trainer.verl_plugin.settings import (
    TASK_MANAGER_FILES,
    VERL_AGENT_LOOP,
    VERL_POLICY_LOSS,
    VERL_TRAINER,
)


class VerlBackendConfig(StrictModel):
    """The `verl` section of a run YAML."""

    model_path: str = Field(min_length=1, description="a local HF directory (nothing is downloaded)")
    nnodes: int = Field(default=1, ge=1)
    n_gpus_per_node: int = Field(default=8, ge=1)
    rollout_engine: Literal["vllm", "sglang"] = "vllm"
    tensor_parallel: int = Field(default=1, ge=1, description="rollout tensor parallelism")
    gpu_memory_utilization: float = Field(default=0.6, gt=0, le=1)
    prompt_length: int = Field(default=2048, ge=16, description="training prompt tokens (experience stripped)")
    response_length: int = Field(default=4096, ge=16, description="all turns of an episode, observations included")
    micro_batch_size_per_gpu: int = Field(default=1, ge=1)
    dynamic_batch_size: bool = Field(default=True, description="pack micro-batches by tokens (use_dynamic_bsz)")
    max_tokens_per_gpu: int = Field(default=16384, ge=256, description="token budget of a packed micro-batch")
    param_offload: bool = False
    optimizer_offload: bool = False
    gradient_checkpointing: bool = True
    train_files: str | None = Field(default=None, description="parquet written by `python -m trainer.verl_plugin "
                                    "dataset`; without it the batches come from trainer.services.task_url")
    val_files: str | None = None
    project: str = "evolver"
    experiment: str = "verl"
    loggers: list[str] = Field(default_factory=lambda: ["console", "tensorboard"])
    save_every: int = Field(default=-1, ge=-1, description="checkpoint every N steps (-1: never)")
    test_every: int = Field(default=-1, ge=-1, description="validate every N steps (-1: never)")
    experience_workspace: str | None = Field(default=None, description="default: trainer.experience.workspace")
    experience_top_k: int | None = Field(default=None, ge=1, description="default: trainer.experience.top_k")
    clip_high_boosted: float | None = Field(default=None, ge=0, description="default: trainer.loss.clip_high_boosted")
    extra_overrides: list[str] = Field(default_factory=list, description="raw Hydra overrides, appended last")

    @model_validator(mode="after")
    def _tp_fits(self) -> VerlBackendConfig:
        if self.n_gpus_per_node % self.tensor_parallel:
            raise ValueError(f"tensor_parallel={self.tensor_parallel} must divide n_gpus_per_node="
                             f"{self.n_gpus_per_node}")
        return self


class ServiceUrls(BaseModel):
    """`trainer.services` as the launcher fills it; fields the veRL backend does not use are ignored."""

    model_config = ConfigDict(extra="ignore")
    env_url: str | None = None
    experience_url: str | None = None
    task_url: str | None = None
    judge_url: str | None = None


class TrainerSection(BaseModel):
    """The parts of the run's `trainer` section the veRL backend reads (the rest is the local trainer's)."""

    model_config = ConfigDict(extra="ignore")
    seed: int = 0
    steps: int = Field(default=10, ge=1)
    tasks_per_step: int = Field(default=4, ge=1)
    output_dir: str = "runs/trainer"
    rollout: RolloutConfig
    optim: OptimConfig = Field(default_factory=OptimConfig)
    loss: PolicyLossConfig = Field(default_factory=PolicyLossConfig)
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    services: ServiceUrls = Field(default_factory=ServiceUrls)
    experience: ExperienceConfig = Field(default_factory=ExperienceConfig)
    tasks: TaskSourceConfig = Field(default_factory=TaskSourceConfig)


def hydra_value(value: Any) -> str:
    """A Python value as Hydra override grammar (strings always quoted: URLs and paths have ':' and '/')."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def _leaves(prefix: str, data: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        path = f"{prefix}.{key}"
        if isinstance(value, dict) and value:
            yield from _leaves(path, value)
        else:
            yield path, value


def translate(run: dict[str, Any], *, env_url: str | None = None, experience_url: str | None = None,
              judge_url: str | None = None, task_url: str | None = None) -> list[str]:
    """The Hydra overrides of a run YAML (already composed to a dict). URLs given here win over the YAML."""
    if "verl" not in run:
        raise ValueError("the run YAML has no `verl` section (model_path, GPUs, lengths): see examples/overall_gpu.yaml")
    if "trainer" not in run:
        raise ValueError("the run YAML has no `trainer` section")
    verl = validate(VerlBackendConfig, run["verl"], root="verl")
    trainer = validate(TrainerSection, run["trainer"], root="trainer")
    env_url = env_url or trainer.services.env_url
    if not env_url:
        raise ValueError("no env_service URL: set trainer.services.env_url or pass --env-url")
    experience_url = experience_url or trainer.services.experience_url
    judge_url = judge_url or trainer.services.judge_url
    task_url = task_url or trainer.services.task_url
    if trainer.advantage.needs_step_labels and not judge_url:
        raise ValueError(f"trainer.advantage.estimator={trainer.advantage.estimator} needs step labels: set "
                         "trainer.services.judge_url or pass --judge-url")
    if not task_url and not verl.train_files:
        raise ValueError("no training tasks: set trainer.services.task_url (the task manager) or verl.train_files "
                         "(a parquet from `python -m trainer.verl_plugin dataset`)")
    if trainer.rollout.experience_ratio > 0 and not experience_url:
        raise ValueError("trainer.rollout.experience_ratio > 0 needs trainer.services.experience_url "
                         "(or --experience-url)")
    if trainer.experience.mode != "group_start" and not experience_url:
        raise ValueError(f"trainer.experience.mode={trainer.experience.mode} searches the pool: set "
                         "trainer.services.experience_url (or --experience-url)")
    if trainer.experience.mode != "group_start" and trainer.rollout.experience_ratio > 0:
        raise ValueError(f"trainer.experience.mode={trainer.experience.mode} replaces the group-start injection: "
                         "set trainer.rollout.experience_ratio to 0")
    if trainer.experience.ask_reward != "none":
        # A branch continues one finished rollout with its own generations replayed and credits a step before
        # the advantage; veRL's agent loop returns each rollout to veRL as it ends and computes advantages there.
        raise ValueError(f"trainer.experience.ask_reward={trainer.experience.ask_reward} runs on the local trainer "
                         "only (the veRL backend has no paired branches): set trainer.experience.ask_reward: none")
    if trainer.tasks_per_step % trainer.optim.minibatches:
        raise ValueError(f"trainer.tasks_per_step={trainer.tasks_per_step} must be a multiple of "
                         f"trainer.optim.minibatches={trainer.optim.minibatches} (veRL mini-batches are whole groups)")
    loss, optim, rollout = trainer.loss, trainer.optim, trainer.rollout
    if rollout.max_context > verl.prompt_length + verl.response_length:
        # vLLM's context is prompt_length + response_length; our template must stop generating before it.
        raise ValueError(f"trainer.rollout.max_context={rollout.max_context} exceeds verl.prompt_length + "
                         f"verl.response_length = {verl.prompt_length + verl.response_length}")

    plain: dict[str, Any] = {
        # data: one row per task; our agent loop ignores the prompt text and starts the environment
        # the task manager's batches step by step (EvolverTaskDataset), else the parquet's rows
        "data.train_files": TASK_MANAGER_FILES if task_url else verl.train_files,
        "data.val_files": verl.val_files or verl.train_files or TASK_MANAGER_FILES,
        "data.train_batch_size": trainer.tasks_per_step,
        "data.max_prompt_length": verl.prompt_length,
        "data.max_response_length": verl.response_length,
        "data.seed": trainer.seed,
        # in order and in the trainer process: each step's batch is asked for after the last step's feedback
        "data.shuffle": False,
        "data.dataloader_num_workers": 0,
        # the policy model and its optimiser
        "actor_rollout_ref.model.path": verl.model_path,
        "actor_rollout_ref.model.enable_gradient_checkpointing": verl.gradient_checkpointing,
        "actor_rollout_ref.actor.optim.lr": optim.lr,
        "actor_rollout_ref.actor.optim.weight_decay": optim.weight_decay,
        "actor_rollout_ref.actor.grad_clip": optim.grad_clip,
        "actor_rollout_ref.actor.ppo_epochs": optim.epochs,
        "actor_rollout_ref.actor.ppo_mini_batch_size": trainer.tasks_per_step // optim.minibatches,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": verl.micro_batch_size_per_gpu,
        "actor_rollout_ref.actor.use_dynamic_bsz": verl.dynamic_batch_size,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": verl.max_tokens_per_gpu,
        "actor_rollout_ref.actor.fsdp_config.param_offload": verl.param_offload,
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload": verl.optimizer_offload,
        # our loss: PPO clip bounds, dual clip, token-mean like the local trainer; KL and entropy by veRL
        "actor_rollout_ref.actor.policy_loss.loss_mode": VERL_POLICY_LOSS,
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
        "actor_rollout_ref.actor.clip_ratio_low": loss.clip_low,
        "actor_rollout_ref.actor.clip_ratio_high": loss.clip_high,
        "actor_rollout_ref.actor.clip_ratio_c": loss.dual_clip_c,
        "actor_rollout_ref.actor.use_kl_loss": loss.kl_coef > 0,
        "actor_rollout_ref.actor.kl_loss_coef": loss.kl_coef,
        "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff": loss.entropy_coef,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": verl.micro_batch_size_per_gpu,
        # the rollout: our agent loop behind vLLM/SGLang
        "actor_rollout_ref.rollout.name": verl.rollout_engine,
        "actor_rollout_ref.rollout.n": rollout.n,
        "actor_rollout_ref.rollout.temperature": rollout.temperature,
        "actor_rollout_ref.rollout.top_p": rollout.top_p,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": verl.tensor_parallel,
        "actor_rollout_ref.rollout.gpu_memory_utilization": verl.gpu_memory_utilization,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": verl.micro_batch_size_per_gpu,
        "actor_rollout_ref.rollout.agent.default_agent_loop": VERL_AGENT_LOOP,
        # advantage: ours, with veRL's own switch kept consistent with it
        "algorithm.adv_estimator": catalog.verl_name(trainer.advantage.estimator),
        "algorithm.norm_adv_by_std_in_grpo": trainer.advantage.grpo.normalize_by_std,
        "algorithm.use_kl_in_reward": False,
        # the trainer
        "trainer.v1.trainer_mode": VERL_TRAINER,
        "trainer.nnodes": verl.nnodes,
        "trainer.n_gpus_per_node": verl.n_gpus_per_node,
        "trainer.total_training_steps": trainer.steps,
        "trainer.project_name": verl.project,
        "trainer.experiment_name": verl.experiment,
        "trainer.logger": verl.loggers,
        "trainer.default_local_dir": trainer.output_dir,
        "trainer.save_freq": verl.save_every,
        "trainer.test_freq": verl.test_every,
    }
    if task_url:  # our dataset class (it reads the validation parquet too); else veRL's own reads the parquets
        plain.update({"data.custom_cls.path": "pkg://trainer.verl_plugin.dataset",
                      "data.custom_cls.name": "EvolverTaskDataset"})
    overrides = [f"{key}={hydra_value(value)}" for key, value in plain.items()]

    # Our own nodes (new keys: the `+` prefix). Leaves one by one, so each is a plain Hydra value.
    overrides += [f"+{path}={hydra_value(v)}" for path, v in
                  _leaves("algorithm.evolver", trainer.advantage.model_dump(mode="json"))]
    experience = trainer.experience.model_copy(update={
        k: v for k, v in {"workspace": verl.experience_workspace, "top_k": verl.experience_top_k}.items()
        if v is not None})
    evolver: dict[str, Any] = {
        "env_url": env_url,
        "rollout": rollout.model_dump(mode="json"),
        "estimator": trainer.advantage.estimator,
        "seed": trainer.seed,
        "tasks_per_step": trainer.tasks_per_step,
        "clip_high_boosted": verl.clip_high_boosted if verl.clip_high_boosted is not None else loss.clip_high_boosted,
        "judge_url": judge_url,
        "run_id": f"{verl.project}-{verl.experiment}",
    }
    if experience_url:
        evolver["experience"] = {"url": experience_url, **experience.model_dump(mode="json")}
    if task_url:
        evolver["tasks"] = {"url": task_url, **trainer.tasks.model_dump(mode="json")}
        data = {"env": rollout.env, "batch_size": trainer.tasks_per_step, "steps": trainer.steps,
                "seed": trainer.seed, "task_url": task_url, "synthetic_ratio": trainer.tasks.synthetic_ratio}
        overrides += [f"+{path}={hydra_value(v)}" for path, v in _leaves("data.evolver", data)]
    overrides += [f"+{path}={hydra_value(v)}" for path, v in _leaves("evolver", evolver)]
    return overrides + list(verl.extra_overrides)
