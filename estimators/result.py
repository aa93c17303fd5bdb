"""What an estimator returns, and the error of a batch it cannot use. No torch at import: the built-in
estimator modules, which the launcher's catalog reads, import these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class BatchError(ValueError):
    """The batch handed to an estimator is inconsistent; the message names the row and field."""


@dataclass
class AdvantageResult:
    """Token-level advantages (B, T), 0 on masked tokens, plus per-step values and scalar metrics."""

    advantages: torch.Tensor
    step_advantages: list[list[float]] = field(default_factory=list)  # per row, K_i values (empty for grpo)
    metrics: dict[str, float] = field(default_factory=dict)
