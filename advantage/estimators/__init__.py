"""Advantage estimators (pure torch/numpy, no veRL): GRPO, ADCA-GRPO and GiGPO behind one registry.

    from advantage.estimators import AdvantageBatch, compute_advantages, batch_from_trajectories
    batch = batch_from_trajectories(trajectories)
    adv = compute_advantages("adca_grpo", batch, AdcaGrpoConfig(alpha=0.1), training_step=step)  # (B, T)
"""

from advantage.estimators import adca as _adca  # noqa: F401  (registers "adca_grpo")
from advantage.estimators import gigpo as _gigpo  # noqa: F401  (registers "gigpo")
from advantage.estimators import grpo as _grpo  # noqa: F401  (registers "grpo")
from advantage.estimators.adca import alpha_at
from advantage.estimators.batch import (
    AdvantageBatch,
    BatchError,
    anchor_keys_for,
    batch_from_trajectories,
    normalize_observation,
)
from advantage.estimators.config import (
    AdcaGrpoConfig,
    AdvantageConfig,
    GigpoConfig,
    GrpoConfig,
    StdConvention,
)
from advantage.estimators.registry import (
    AdvantageResult,
    Estimator,
    compute_advantages,
    estimate,
    get_estimator,
    list_estimators,
    register_estimator,
)

__all__ = [
    "AdcaGrpoConfig", "AdvantageBatch", "AdvantageConfig", "AdvantageResult", "BatchError", "Estimator",
    "GigpoConfig", "GrpoConfig", "StdConvention", "alpha_at", "anchor_keys_for", "batch_from_trajectories",
    "compute_advantages", "estimate", "get_estimator", "list_estimators", "normalize_observation",
    "register_estimator",
]
