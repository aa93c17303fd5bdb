"""Our settings inside veRL's Hydra config, validated into pydantic models where they are used.

veRL hands each hook a different slice of its config, so our settings live in two nodes:
- `algorithm.evolver`: our `AdvantageConfig` (estimator settings), the only node an advantage
  estimator sees (`compute_advantage(..., config=algorithm)`);
- `evolver` (top level): the services, the rollout (`RolloutConfig`) and the boosted clip bound,
  read by the agent loop (which gets the whole config) and by the trainer.
Both are written by `trainer.verl_plugin.overrides` from our run YAML.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from common.config import StrictModel, validate
from estimators import AdvantageConfig
from trainer.config import ExperienceConfig, TaskSourceConfig
from trainer.settings import RolloutConfig

# Our names in veRL's registries. Estimators: every name in our catalog as `evolver_<name>`
# (`estimators.catalog.verl_name`); veRL refuses to re-register its own `grpo`.
VERL_POLICY_LOSS = "evolver_boosted"
VERL_TRAINER = "evolver_sync"
VERL_AGENT_LOOP = "evolver_env_agent"
TASK_KEY = "evolver_task"  # extra_info field of a dataset row: the Task as JSON
TASK_MANAGER_FILES = "evolver://task_manager"  # data.train_files: the batches come from the task manager
# A validation batch's rows carry this key (True), put there by `evolver_sync`: veRL tells its agent loop
# worker whether a batch validates, but not the agent loop, which must then run without experience or asks.
VALIDATION_KEY = "evolver_validate"


class ExperienceSettings(ExperienceConfig):
    """The experience manager and how the run uses it (the same knobs as the local trainer's `experience`)."""

    url: str = Field(min_length=1, description="experience_manager base URL")


class TaskSettings(TaskSourceConfig):
    """The task manager (self-questioning): batches, grading of synthetic tasks, curriculum feedback."""

    url: str = Field(min_length=1, description="task_manager base URL")


class EvolverVerlSettings(StrictModel):
    """The top-level `evolver` node of veRL's config."""

    env_url: str = Field(min_length=1, description="env_service base URL, reachable from every rollout worker")
    rollout: RolloutConfig
    estimator: str = Field(default="grpo", description="our estimator (algorithm.adv_estimator minus evolver_)")
    seed: int = Field(default=0, description="the run's seed: step s asks the task manager with its step seed")
    tasks_per_step: int = Field(default=4, ge=1)
    experience: ExperienceSettings | None = None
    tasks: TaskSettings | None = None
    judge_url: str | None = Field(default=None, description="judge service; needed by estimators needing step labels")
    clip_high_boosted: float = Field(default=0.6, ge=0, description="upper clip bound of helped samples, A > 0")
    timeout_s: float = Field(default=120.0, gt=0, description="per HTTP call to our services")
    outage_budget_s: float = Field(default=120.0, ge=0, description=(
        "how long a call waits for a service that is unreachable or answers 503 before failing; 0: no waiting"))
    judge_fallback_after_s: float = Field(default=30.0, ge=0, description=(
        "the judge down this long: that batch is labelled by the outcome's sign (counted in judge/fallbacks)"))
    logs_dir: str | None = Field(default=None, description="where each service logs (<name>.log): named in errors")

    @model_validator(mode="after")
    def _one_experience_mode(self) -> EvolverVerlSettings:
        if self.experience is not None and self.experience.mode != "group_start" and self.rollout.experience_ratio > 0:
            raise ValueError(f"experience.mode={self.experience.mode} replaces the group-start injection: set "
                             "rollout.experience_ratio to 0")
        if self.experience is not None and self.experience.ask_reward != "none":
            raise ValueError(f"experience.ask_reward={self.experience.ask_reward} runs on the local trainer only "
                             "(the veRL backend has no paired branches): set it to none")
        return self

    def outage(self) -> Any:
        """The `trainer.peers.OutagePolicy` of these settings (imported here: this module stays light)."""
        from trainer.peers import OutagePolicy

        return OutagePolicy(budget_s=self.outage_budget_s, judge_fallback_after_s=self.judge_fallback_after_s,
                            logs_dir=self.logs_dir)
    run_id: str = Field(default="verl", description="ties feedback calls to (run, step) so a resumed step is not re-applied")


def _plain(node: Any) -> Any:
    """An OmegaConf node, dataclass config or dict as plain Python containers."""
    if node is None:
        return None
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(node, DictConfig | ListConfig):
            return OmegaConf.to_container(node, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf ships with veRL
        pass
    return node


def _get(node: Any, key: str) -> Any:
    if node is None:
        return None
    if isinstance(node, dict):
        return node.get(key)
    getter = getattr(node, "get", None)
    if callable(getter):
        return getter(key)
    return getattr(node, key, None)


def plain_node(config: Any, key: str) -> Any:
    """`config[key]` (OmegaConf, dataclass or dict) as plain Python containers; None when absent."""
    return _plain(_get(config, key))


def advantage_settings(algorithm_config: Any) -> AdvantageConfig:
    """`algorithm.evolver` as our AdvantageConfig (defaults when the node is absent)."""
    raw = _plain(_get(algorithm_config, "evolver")) or {}
    return validate(AdvantageConfig, raw, root="algorithm.evolver")


def evolver_settings(trainer_config: Any) -> EvolverVerlSettings:
    """The top-level `evolver` node; a clear error when the run was started without it."""
    raw = _plain(_get(trainer_config, "evolver"))
    if raw is None:
        raise ValueError("veRL config has no `evolver` node: start the run with the overrides printed by "
                         "`python -m trainer.verl_plugin overrides --conf <run.yaml>`")
    return validate(EvolverVerlSettings, raw, root="evolver")
