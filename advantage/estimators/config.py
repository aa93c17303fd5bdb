"""Config sections of the advantage estimators (pydantic, validated at start)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from common.config import StrictModel, validate

# How a group's spread is measured.
# - population: sqrt(mean((x - mean)^2)); a group of one or with zero spread gets 0.
# - unbiased:   sqrt(sum((x - mean)^2) / (n - 1)); a group of one or with zero spread gets 0.
# - verl:       veRL's `grpo` exactly: unbiased std plus `epsilon` in the denominator, and a group
#               of one is normalised with mean 0 and std 1 (so it keeps its raw score).
StdConvention = Literal["population", "unbiased", "verl"]


class GrpoConfig(StrictModel):
    """Outcome z-scored within each task group, broadcast to every policy token."""

    std: StdConvention = "unbiased"
    normalize_by_std: bool = Field(default=True, description="False: Dr. GRPO, subtract the group mean only")
    epsilon: float = Field(default=1e-6, ge=0, description="added to the std in the `verl` convention only")


class AdcaGrpoConfig(StrictModel):
    """AgentEvolver's decoupled ADCA-GRPO: judge labels (GOOD=+1/BAD=-1) plus the group outcome."""

    alpha: float = Field(default=0.1, ge=0, description="weight of the standardised attribution reward")
    alpha_schedule: Literal["constant", "cosine"] = "constant"
    alpha_min: float = Field(default=0.0, ge=0, description="alpha reached at total_steps under cosine decay")
    total_steps: int | None = Field(default=None, ge=1, description="training steps the cosine decay spans")
    prm_steps: int | None = Field(
        default=None, ge=0,
        description="attribution only while training_step < prm_steps, then plain GRPO; None: always")
    outcome_placement: Literal["last_step", "all_steps"] = "last_step"
    length_normalization: bool = Field(default=False, description="scale each step reward by 1/sqrt(K)")
    outcome_std: Literal["population", "unbiased"] = "population"
    when_outcomes_equal: Literal["keep", "skip"] = Field(default="keep", description=(
        "a group whose outcomes are all equal has no outcome advantage, so its z-scored labels are its whole "
        "advantage. keep: use them (AgentEvolver's behaviour); skip: such a group gets no advantage at all"))
    after_prm: GrpoConfig = Field(default_factory=GrpoConfig,
                                  description="the GRPO used once training_step >= prm_steps")

    @model_validator(mode="after")
    def _schedule_complete(self) -> AdcaGrpoConfig:
        if self.alpha_schedule == "cosine":
            if self.total_steps is None:
                raise ValueError("alpha_schedule=cosine needs total_steps (the training steps the decay spans)")
            if self.alpha_min > self.alpha:
                raise ValueError(f"alpha_min ({self.alpha_min}) must not exceed alpha ({self.alpha})")
        return self


class GigpoConfig(StrictModel):
    """verl-agent's GiGPO: episode-level group advantage + weighted anchor-state step advantage."""

    step_weight: float = Field(default=1.0, ge=0, description="weight of the step-level (anchor) advantage")
    gamma: float = Field(default=0.95, ge=0, le=1, description="discount of the per-step returns")
    std: StdConvention = "unbiased"
    normalize_by_std: bool = Field(default=False, description="verl-agent's default mode is mean_norm (False)")
    epsilon: float = Field(default=1e-6, ge=0, description="added to the std in the `verl` convention only")


class AdvantageConfig(StrictModel):
    """The `advantage` section of a run: which estimator and the settings of each.

    `estimator` is any name in the estimator catalog (`advantage.estimators.catalog`): the built-ins
    have their own sections below; an estimator registered from outside the package reads its
    settings from `options.<name>` (validated by the settings model it registered).
    """

    estimator: str = "grpo"
    grpo: GrpoConfig = Field(default_factory=GrpoConfig)
    adca_grpo: AdcaGrpoConfig = Field(default_factory=AdcaGrpoConfig)
    gigpo: GigpoConfig = Field(default_factory=GigpoConfig)
    options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="settings of estimators registered outside advantage/, by name")

    @model_validator(mode="after")
    def _known_estimator(self) -> AdvantageConfig:
        from advantage.estimators import catalog  # the catalog imports this module's settings models

        spec = catalog.get_spec(self.estimator)  # ValueError naming the known estimators
        if self.estimator not in catalog.BUILTIN_NAMES:
            spec.config_model.model_validate(self.options.get(self.estimator, {}))
        return self

    @property
    def needs(self) -> frozenset[str]:
        """What the selected estimator declared it needs ("step_labels", "anchor_keys")."""
        from advantage.estimators import catalog

        return catalog.needs(self.estimator)

    @property
    def needs_step_labels(self) -> bool:
        return "step_labels" in self.needs

    def config_for(self, name: str) -> BaseModel:
        """The settings of estimator `name`: its section, or `options.<name>` for an outside one."""
        section = getattr(self, name, None) if name in ("grpo", "adca_grpo", "gigpo") else None
        if section is not None:
            return section
        from advantage.estimators import catalog

        return validate(catalog.get_spec(name).config_model, self.options.get(name, {}),
                        root=f"advantage.options.{name}")

    def estimator_config(self) -> BaseModel:
        """The settings of the selected estimator."""
        return self.config_for(self.estimator)
