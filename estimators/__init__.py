"""Advantage estimators (pure torch/numpy, no veRL): GRPO, ADCA-GRPO and GiGPO behind one registry.

    from estimators import AdvantageBatch, compute_advantages, batch_from_trajectories
    batch = batch_from_trajectories(trajectories)
    adv = compute_advantages("adca_grpo", batch, AdcaGrpoConfig(alpha=0.1), training_step=step)  # (B, T)

The settings models, the built-in estimators' modules and the catalog (names, needs) import no torch;
the batch and the registry (the rest exported here) are imported on first use, so
`from estimators import AdvantageConfig` stays light enough for the launcher.
"""

from __future__ import annotations

import importlib
from typing import Any

from estimators.builtin.adca import AdcaGrpoConfig, alpha_at
from estimators.builtin.gigpo import GigpoConfig
from estimators.builtin.grpo import GrpoConfig
from estimators.config import AdvantageConfig
from estimators.grouping import StdConvention
from estimators.result import AdvantageResult, BatchError
from estimators.spec import EstimatorSpec, estimator

# The built-ins whose step path reads `AdvantageBatch.step_credits` (ADCA's step rewards, GiGPO's step returns):
# the estimators `trainer.experience.ask_reward: paired_branch` can run with.
STEP_CREDIT_ESTIMATORS: tuple[str, ...] = ("adca_grpo", "gigpo")

# name -> the module that defines it (imported lazily: these pull in torch)
_LAZY = {
    "AdvantageBatch": "batch", "anchor_keys_for": "batch",
    "batch_from_rows": "batch", "batch_from_trajectories": "batch", "label_values": "batch",
    "normalize_observation": "batch",
    "compute_advantages": "registry", "estimate": "registry", "get_estimator": "registry",
    "register_estimator": "registry",
    "join_segments": "segments", "split_row": "segments",
}

__all__ = [
    "AdcaGrpoConfig", "AdvantageConfig", "AdvantageResult", "BatchError", "EstimatorSpec", "GigpoConfig",
    "GrpoConfig", "STEP_CREDIT_ESTIMATORS", "StdConvention", "alpha_at", "estimator", *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'estimators' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"estimators.{module}"), name)
    globals()[name] = value
    return value
