"""GRPO: the outcome z-scored within each task group, the same value on every policy token."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from common.config import StrictModel
from estimators.grouping import StdConvention, normalize_in_groups
from estimators.result import AdvantageResult
from estimators.spec import estimator
from estimators.tokens import broadcast_rows

if TYPE_CHECKING:
    from estimators.batch import AdvantageBatch


class GrpoConfig(StrictModel):
    """Outcome z-scored within each task group, broadcast to every policy token."""

    std: StdConvention = "unbiased"
    normalize_by_std: bool = Field(default=True, description="False: Dr. GRPO, subtract the group mean only")
    epsilon: float = Field(default=1e-6, ge=0, description="added to the std in the `verl` convention only")


def grpo_scores(batch: AdvantageBatch, config: GrpoConfig):
    """Per-trajectory GRPO advantage (B,) as float64 numpy, from outcome (B,) and the groups."""
    outcome = batch.outcome.detach().double().cpu().numpy()
    return normalize_in_groups(outcome, batch.groups(), std=config.std, by_std=config.normalize_by_std,
                               epsilon=config.epsilon)


@estimator("grpo", GrpoConfig)
def grpo(batch: AdvantageBatch, config: GrpoConfig, training_step: int) -> AdvantageResult:
    """Reads outcome (B,) and the group of each row; advantages (B, T) float32: row i's score on its tokens."""
    scores = grpo_scores(batch, config)
    groups = batch.groups()
    degenerate = sum(1 for rows in groups if len(set(scores[rows].tolist())) == 1)
    return AdvantageResult(
        advantages=broadcast_rows(batch, scores),
        metrics={"adv/groups": float(len(groups)), "adv/groups_without_signal": float(degenerate)},
    )
