"""Within-group normalisation shared by the estimators (float64 numpy: exact and cheap at batch sizes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

# How a group's spread is measured.
# - population: sqrt(mean((x - mean)^2)); a group of one or with zero spread gets 0.
# - unbiased:   sqrt(sum((x - mean)^2) / (n - 1)); a group of one or with zero spread gets 0.
# - verl:       veRL's `grpo` exactly: unbiased std plus `epsilon` in the denominator, and a group
#               of one is normalised with mean 0 and std 1 (so it keeps its raw score).
StdConvention = Literal["population", "unbiased", "verl"]


def has_spread(values: np.ndarray) -> bool:
    """True unless every value is exactly equal (rounding in a computed std must not fake a spread)."""
    return values.size >= 2 and bool(values.max() != values.min())


def normalize_in_groups(values: np.ndarray, groups: Sequence[Sequence[int]], *, std: StdConvention,
                        by_std: bool, epsilon: float = 1e-6) -> np.ndarray:
    """Centre (and scale) `values` within each group of row indices.

    `population` / `unbiased`: a group of one or with zero spread gets 0, never NaN.
    `verl`: veRL's `grpo` rule, kept bit-for-bit in spirit: a group of one uses mean 0 and std 1,
    others the unbiased std, and the denominator is std + epsilon.
    """
    out = np.zeros_like(values, dtype=np.float64)
    for rows in groups:
        idx = np.asarray(rows, dtype=np.int64)
        group = values[idx].astype(np.float64)
        if std == "verl":
            if group.size == 1:
                mean, spread = 0.0, 1.0
            else:
                mean, spread = group.mean(), group.std(ddof=1)
            out[idx] = (group - mean) / (spread + epsilon) if by_std else group - mean
            continue
        if not has_spread(group):
            continue  # a group of one or identical values carries no relative signal
        centred = group - group.mean()
        out[idx] = centred / group.std(ddof=0 if std == "population" else 1) if by_std else centred
    return out
