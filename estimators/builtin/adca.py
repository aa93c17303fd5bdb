"""ADCA-GRPO (AgentEvolver's decoupled scheme): judge labels and outcome standardised separately.

Per task group g with trajectories i (K_i steps, labels l_{i,t}):
  mu_g     = mean_i( mean_t l_{i,t} )                       (each trajectory weighs the same)
  var_g    = mean_i( mean_t (l_{i,t} - mu_g)^2 )
  a_{i,t}  = (l_{i,t} - mu_g) / sqrt(var_g)                  (0 when every label in the group is equal)
  o_i      = (R_i - mean_g R) / std_g R                      (mean only when the spread is zero)
  c_{i,t}  = the step's credit (`step_credits`; 0 without): with `ask_reward: paired_branch`, on an
             asking step the outcome with the answer minus the outcome of its branch without it
  r_{i,t}  = alpha * a_{i,t} + [t = K_i - 1] * o_i + c_{i,t} (or + o_i on all steps)
             times 1/sqrt(K_i) with length_normalization
  A_{i,t}  = sum_{j >= t} r_{i,j}                            broadcast to the tokens of step t
So an ask's credit reaches the asking step and, as a return, every step before it (not the steps after).
A group whose outcomes are all equal (o = 0) moves on its labels (and credits) alone;
`when_outcomes_equal: skip` gives it a = 0 too, and keeps its credits: a credit is a paired comparison
of one rollout with its own branch, not a comparison within the group. Either way the metrics count such
groups and the share of the step's advantage mass (sum of |A| over policy tokens) their rows carry.
From `prm_steps` on the estimator is plain GRPO, which has no steps: credits are not used there.
Because labels are z-scored, only their sign pattern matters: GOOD=+1/BAD=-1 and +-0.2 agree.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field, model_validator

from common.config import StrictModel
from estimators.builtin.grpo import GrpoConfig, grpo
from estimators.grouping import has_spread, normalize_in_groups
from estimators.result import AdvantageResult, BatchError
from estimators.spec import estimator
from estimators.tokens import broadcast_steps, suffix_sums

if TYPE_CHECKING:
    import torch

    from estimators.batch import AdvantageBatch


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


def alpha_at(config: AdcaGrpoConfig, training_step: int) -> float:
    """alpha, or its cosine decay alpha_min + (alpha - alpha_min)(1 + cos(pi * step / total)) / 2."""
    if config.alpha_schedule == "constant":
        return config.alpha
    assert config.total_steps is not None  # guaranteed by the config validator
    progress = min(training_step, config.total_steps) / config.total_steps
    return config.alpha_min + 0.5 * (config.alpha - config.alpha_min) * (1.0 + math.cos(math.pi * progress))


def standardize_labels(labels: list[np.ndarray], groups: list[list[int]]) -> list[np.ndarray]:
    """Group z-score of step labels with equal weight per trajectory (see the module docstring)."""
    out = [np.zeros_like(row) for row in labels]
    for rows in groups:
        members = [i for i in rows if labels[i].size]
        if not members:
            continue
        mu = float(np.mean([labels[i].mean() for i in members]))
        var = float(np.mean([((labels[i] - mu) ** 2).mean() for i in members]))
        scale = max(float(np.abs(labels[i]).max()) for i in members)
        # Identical labels leave only rounding noise in var: treat as no spread (relative test keeps
        # the result independent of the label magnitude).
        if var <= (1e-12 * scale) ** 2:
            continue
        for i in members:
            out[i] = (labels[i] - mu) / math.sqrt(var)
    return out


@estimator("adca_grpo", AdcaGrpoConfig, needs=("step_labels",))
def adca_grpo(batch: AdvantageBatch, config: AdcaGrpoConfig, training_step: int) -> AdvantageResult:
    """Reads outcome (B,), step_ids (B, T), per row K_i step labels; advantages (B, T) float32 (A_{i,t} on
    the tokens of step t), step_advantages K_i per row. From `prm_steps` on: `grpo` with `after_prm`."""
    if config.prm_steps is not None and training_step >= config.prm_steps:
        result = grpo(batch, config.after_prm, training_step)
        result.metrics.update({"adv/attribution_active": 0.0, "adv/alpha": 0.0})
        return result

    if batch.step_labels is None:
        raise BatchError("adca_grpo needs step_labels (judge GOOD/BAD per step) for every row")
    missing = [i for i, row in enumerate(batch.step_labels) if row is None]
    if missing:
        raise BatchError(f"adca_grpo needs step_labels for every row; rows {missing} have none")
    labels = [np.asarray(row, dtype=np.float64) for row in batch.step_labels]
    groups = batch.groups()
    alpha = alpha_at(config, training_step)

    attribution = standardize_labels(labels, groups)
    raw_outcome = batch.outcome.detach().double().cpu().numpy()
    outcome = normalize_in_groups(raw_outcome, groups, std=config.outcome_std, by_std=True)
    equal_groups = [rows for rows in groups if not has_spread(raw_outcome[np.asarray(rows, dtype=np.int64)])]
    if config.when_outcomes_equal == "skip":
        for rows in equal_groups:
            for i in rows:
                attribution[i] = np.zeros_like(attribution[i])

    step_advantages: list[list[float]] = []
    for i, attr in enumerate(attribution):
        k = attr.size
        rewards = alpha * attr + batch.credits(i, k)
        if k:
            if config.outcome_placement == "last_step":
                rewards[-1] += outcome[i]
            else:
                rewards += outcome[i]
            if config.length_normalization:
                rewards /= math.sqrt(k)
        step_advantages.append(suffix_sums(rewards).tolist())

    good = sum(int((row > 0).sum()) for row in labels)
    total = sum(row.size for row in labels)
    advantages = broadcast_steps(batch, step_advantages)
    return AdvantageResult(
        advantages=advantages,
        step_advantages=step_advantages,
        metrics={"adv/attribution_active": 1.0, "adv/alpha": alpha,
                 "adv/good_label_rate": good / total if total else 0.0,
                 "adv/equal_outcome_groups": float(len(equal_groups)), **batch.credit_metrics(),
                 "adv/equal_outcome_mass_share": mass_share(batch, advantages, [i for g in equal_groups for i in g])},
    )


def mass_share(batch: AdvantageBatch, advantages: torch.Tensor, rows: list[int]) -> float:
    """sum |A| over the policy tokens of `rows` / sum |A| over every policy token (0 when all are 0)."""
    per_row = (advantages.abs() * batch.response_mask.to(advantages.dtype)).sum(dim=1).double()
    total = float(per_row.sum())
    return float(per_row[rows].sum()) / total if rows and total > 0 else 0.0
