"""Mixture and curriculum: which tasks go into a training batch.

A batch mixes original and synthetic tasks by `synthetic_ratio` (the other pool fills in when one
runs short). With the curriculum on, each task is weighted by its recent pass rate from trainer
feedback: tasks inside the learnable band [low, high] weigh 1, tasks never tried weigh
`unseen_weight`, and the rest (too easy or, for now, too hard) weigh `outside_weight` so they
are still sampled now and then. Sampling is weighted, without replacement inside a pool
(Efraimidis-Spirakis keys), and repeats only when a pool is smaller than its share.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from common.schemas import Task
from task_manager.settings import CurriculumSettings


def task_key(task: Task) -> str:
    """Pass rates are kept per (environment, task id): original ids repeat across environments."""
    return f"{task.env_type}/{task.task_id}"


def weight(rate: tuple[float, int] | None, curriculum: CurriculumSettings) -> float:
    if not curriculum.enabled:
        return 1.0
    if rate is None or rate[1] == 0:
        return curriculum.unseen_weight
    return 1.0 if curriculum.low <= rate[0] <= curriculum.high else curriculum.outside_weight


def weighted_sample(pool: Sequence[Task], weights: Sequence[float], k: int, rng: random.Random) -> list[Task]:
    if k <= 0 or not pool:
        return []
    chosen: list[Task] = []
    while len(chosen) < k:
        # Efraimidis-Spirakis: key u^(1/w), take the largest; zero weights go last.
        keyed = sorted(((rng.random() ** (1.0 / w) if w > 0 else -rng.random(), i) for i, w in enumerate(weights)),
                       reverse=True)
        chosen.extend(pool[i] for _, i in keyed[: k - len(chosen)])
    return chosen


@dataclass
class BatchPlan:
    tasks: list[Task]
    original: int
    synthetic: int
    in_band: int


def sample_batch(originals: Sequence[Task], synthetic: Sequence[Task], rates: dict[str, tuple[float, int]],
                 size: int, ratio: float, use_original: bool, curriculum: CurriculumSettings,
                 rng: random.Random) -> BatchPlan:
    if not use_original:
        originals = []
    if not originals and not synthetic:
        return BatchPlan([], 0, 0, 0)
    n_synthetic = round(size * ratio) if originals else size
    n_synthetic = min(n_synthetic, size) if synthetic else 0
    n_original = size - n_synthetic if originals else 0
    if not originals:
        n_synthetic = size
    picked_synthetic = weighted_sample(synthetic, [weight(rates.get(task_key(t)), curriculum) for t in synthetic],
                                       n_synthetic, rng)
    picked_original = weighted_sample(originals, [weight(rates.get(task_key(t)), curriculum) for t in originals],
                                      n_original, rng)
    tasks = picked_original + picked_synthetic
    rng.shuffle(tasks)
    in_band = sum(1 for t in tasks if (r := rates.get(task_key(t))) and r[1] and curriculum.low <= r[0] <= curriculum.high)
    return BatchPlan(tasks, len(picked_original), len(picked_synthetic), in_band)
