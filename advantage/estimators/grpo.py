"""GRPO: the outcome z-scored within each task group, the same value on every policy token."""

from __future__ import annotations

from advantage.estimators.batch import AdvantageBatch
from advantage.estimators.config import GrpoConfig
from advantage.estimators.grouping import normalize_in_groups
from advantage.estimators.registry import AdvantageResult, register_estimator
from advantage.estimators.tokens import broadcast_rows


def grpo_scores(batch: AdvantageBatch, config: GrpoConfig):
    """Per-trajectory GRPO advantage (B,) as float64 numpy."""
    outcome = batch.outcome.detach().double().cpu().numpy()
    return normalize_in_groups(outcome, batch.groups(), std=config.std, by_std=config.normalize_by_std,
                               epsilon=config.epsilon)


@register_estimator("grpo", GrpoConfig)
def grpo(batch: AdvantageBatch, config: GrpoConfig, training_step: int) -> AdvantageResult:
    scores = grpo_scores(batch, config)
    groups = batch.groups()
    degenerate = sum(1 for rows in groups if len(set(scores[rows].tolist())) == 1)
    return AdvantageResult(
        advantages=broadcast_rows(batch, scores),
        metrics={"adv/groups": float(len(groups)), "adv/groups_without_signal": float(degenerate)},
    )
