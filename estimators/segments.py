"""Training segments <-> estimator rows: the one place both backends join and split them.

A template that rewrites its context (sliding_window, self_managed) trains one trajectory as several
segments; an estimator sees the trajectory as one row (its segments' response tokens side by side).
The local trainer and the veRL plugin both join with `join_segments` and split the advantages back
with `split_row`, so a token lands on the same advantage whichever backend ran it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def join_segments(parts: Sequence[Sequence[T]]) -> list[T]:
    """The per-token values of a trajectory's segments, in segment order, as one row."""
    return [value for part in parts for value in part]


def split_row(row: Sequence[T], lengths: Sequence[int]) -> list[list[T]]:
    """A joined row cut back into segments of `lengths` tokens (the inverse of `join_segments`)."""
    if any(n < 0 for n in lengths):
        raise ValueError(f"segment lengths must be >= 0, got {list(lengths)}")
    if sum(lengths) > len(row):
        raise ValueError(f"segments of {sum(lengths)} tokens do not fit a row of {len(row)}")
    out: list[list[T]] = []
    offset = 0
    for n in lengths:
        out.append(list(row[offset:offset + n]))
        offset += n
    return out
