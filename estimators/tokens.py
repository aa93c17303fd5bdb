"""Broadcasting per-trajectory and per-step values onto response tokens.

torch is imported when a function runs, not with the module: the built-in estimator modules import these
helpers, and the launcher imports those modules (for their specs) without torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

    from estimators.batch import AdvantageBatch


def broadcast_rows(batch: AdvantageBatch, per_row: np.ndarray) -> torch.Tensor:
    """per_row (B,) onto all of each row's tokens: (B, T) float32 (masking happens in `estimate`)."""
    import torch

    values = torch.as_tensor(per_row, dtype=torch.float32, device=batch.response_mask.device)
    return values.unsqueeze(-1).expand(batch.response_mask.shape).clone()


def broadcast_steps(batch: AdvantageBatch, per_step: Sequence[Sequence[float]]) -> torch.Tensor:
    """per_step (B rows of K_i values): step t's value onto the tokens with step id t, (B, T) float32;
    tokens in no step (-1) get 0."""
    import torch

    b = batch.size
    width = max((len(row) for row in per_step), default=0)
    table = torch.zeros((b, max(width, 1)), dtype=torch.float32)
    for i, row in enumerate(per_step):
        if len(row):
            table[i, : len(row)] = torch.as_tensor(np.asarray(row, dtype=np.float64), dtype=torch.float32)
    table = table.to(batch.response_mask.device)
    ids = batch.step_ids.long()
    values = table.gather(1, ids.clamp(min=0))
    return torch.where(ids >= 0, values, torch.zeros_like(values))


def suffix_sums(values: np.ndarray) -> np.ndarray:
    """A_t = sum_{j >= t} r_j (gamma = 1)."""
    return np.cumsum(values[::-1])[::-1].copy() if values.size else values
