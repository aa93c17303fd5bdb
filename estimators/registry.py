"""Running estimators: `estimate(name, batch, config)` over the catalog (`catalog.py`), and the decorator
that registers a new estimator in-process. Used by the local trainer and the veRL plugin alike."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from pydantic import BaseModel

from common.config import validate
from estimators import catalog
from estimators.batch import AdvantageBatch
from estimators.result import AdvantageResult
from estimators.spec import EstimatorSpec, estimator, spec_of

EstimatorFn = Callable[[AdvantageBatch, Any, int], AdvantageResult]


def register_estimator(name: str, config_model: type[BaseModel], *, needs: Iterable[str] = ()
                       ) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator: register `fn(batch, config, training_step) -> AdvantageResult` under `name`.

    `needs` declares what the estimator reads beyond outcomes and groups ("step_labels": the trainer
    then asks the judge once per batch; "anchor_keys"). Nothing else has to change for a new one.
    """

    def decorator(fn: EstimatorFn) -> EstimatorFn:
        declared = estimator(name, config_model, needs=needs)(fn)
        spec = spec_of(declared)
        assert spec is not None
        catalog.add(spec)
        return declared

    return decorator


def get_estimator(name: str) -> EstimatorSpec:
    spec = catalog.get_spec(name)
    spec.load()
    return spec


def estimate(name: str, batch: AdvantageBatch, config: BaseModel | dict | None = None, *,
             training_step: int = 0) -> AdvantageResult:
    """Run estimator `name` on `batch`. `config`: its config model, a dict of its fields, or None (defaults).

    `training_step` (0-based) drives ADCA-GRPO's alpha schedule and its `prm_steps` cut-off. The result's
    advantages are (B, T) float32 on the batch's device, exactly 0 where `response_mask` is 0.
    """
    estimator = get_estimator(name)
    if config is None or isinstance(config, dict):
        config = validate(estimator.config_model, config or {}, root=name)
    elif not isinstance(config, estimator.config_model):
        raise TypeError(f"estimator {name!r} takes a {estimator.config_model.__name__}, "
                        f"got {type(config).__name__}")
    if training_step < 0:
        raise ValueError(f"training_step must be >= 0, got {training_step}")
    batch.validate()
    result = estimator.load()(batch, config, training_step)
    mask = batch.response_mask.to(result.advantages.dtype)
    result.advantages = result.advantages * mask  # masked tokens are exactly 0 whatever the estimator did
    return result


def compute_advantages(name: str, batch: AdvantageBatch, config: BaseModel | dict | None = None, *,
                       training_step: int = 0) -> torch.Tensor:
    """Token-level advantages (B, T) float32 on the batch's device; 0 on masked tokens."""
    return estimate(name, batch, config, training_step=training_step).advantages
