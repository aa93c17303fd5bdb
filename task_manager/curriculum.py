"""Mixture and curriculum: which tasks go into a training batch.

A batch mixes original and synthetic tasks by `synthetic_ratio` (the other pool fills in when one
runs short). With the curriculum on, each task is weighted by its recent pass rate from trainer
feedback: tasks inside the learnable band [low, high] weigh 1, tasks never tried weigh
`unseen_weight`, and the rest (too easy or, for now, too hard) weigh `outside_weight` so they
are still sampled now and then; with `by_kind`, a task without feedback yet takes its kind's pass
rate. A kind (`metadata.task_kind`) that no rollout has solved after `unsolved_after` tries in all, with or
without a demonstration, weighs `unsolved_weight` whatever its tasks' own rates: which kinds the policy can
learn from now is measured, not listed. Sampling is weighted, without replacement inside a pool (Efraimidis-Spirakis keys), and repeats
only when a pool is smaller than its share.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from common.schemas import Task
from task_manager.settings import CurriculumSettings


def task_key(task: Task) -> str:
    """Pass rates are kept per (environment, task id): original ids repeat across environments."""
    return f"{task.env_type}/{task.task_id}"


def task_kind(task: Task) -> str | None:
    """The kind a task shares its pass rate with under `curriculum.by_kind` (a lookup's or a multi-call task's kind, or `goal`)."""
    kind = task.metadata.get("lookup") or task.metadata.get("task") or task.metadata.get("kind")
    return str(kind) if kind else None


def kind_rates(tasks: Sequence[Task], rates: dict[str, tuple[float, int]]) -> dict[str, tuple[float, int]]:
    """Per kind, the mean recent pass rate of its tasks that have feedback, and their rollouts in total."""
    sums: dict[str, list[float]] = {}
    for task in tasks:
        rate, kind = rates.get(task_key(task)), task_kind(task)
        if rate is not None and rate[1] and kind is not None:
            acc = sums.setdefault(kind, [0.0, 0, 0])
            acc[0], acc[1], acc[2] = acc[0] + rate[0], acc[1] + 1, acc[2] + rate[1]
    return {kind: (acc[0] / acc[1], int(acc[2])) for kind, acc in sums.items()}


def task_rates(tasks: Sequence[Task], rates: dict[str, tuple[float, int]],
               curriculum: CurriculumSettings) -> list[tuple[float, int] | None]:
    """Each task's pass rate for weighting: its own, or with `by_kind` its kind's while it has none yet (a
    kind solved 0 times in 8 rollouts says more about an unseen task of that kind than nothing does)."""
    by_kind = kind_rates(tasks, rates) if curriculum.by_kind else {}
    out = []
    for task in tasks:
        rate = rates.get(task_key(task))
        if (rate is None or rate[1] == 0) and (kind := task_kind(task)) in by_kind:
            rate = by_kind[kind]
        out.append(rate)
    return out


def unsolved_kinds(tasks: Sequence[Task], tries: dict[str, tuple[int, int]],
                   curriculum: CurriculumSettings) -> dict[str, int]:
    """Kinds tried at least `unsolved_after` times over all their tasks and never solved -> their tries."""
    if not curriculum.enabled or curriculum.unsolved_after == 0:
        return {}
    totals: dict[str, list[int]] = {}
    for task in tasks:
        kind, seen = task.metadata.get("task_kind"), tries.get(task_key(task))
        if kind and seen:
            acc = totals.setdefault(str(kind), [0, 0])
            acc[0], acc[1] = acc[0] + seen[0], acc[1] + seen[1]
    return {kind: n for kind, (n, solved) in totals.items() if n >= curriculum.unsolved_after and solved == 0}


def task_weights(tasks: Sequence[Task], rates: dict[str, tuple[float, int]], curriculum: CurriculumSettings,
                 unsolved: Collection[str] = ()) -> list[float]:
    return [curriculum.unsolved_weight if task.metadata.get("task_kind") in unsolved else weight(rate, curriculum)
            for task, rate in zip(tasks, task_rates(tasks, rates, curriculum), strict=True)]


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
    unsolved_kinds: dict[str, int] = field(default_factory=dict)  # kinds down-weighted -> their tries


def sample_batch(originals: Sequence[Task], synthetic: Sequence[Task], rates: dict[str, tuple[float, int]],
                 size: int, ratio: float, use_original: bool, curriculum: CurriculumSettings,
                 rng: random.Random, tries: dict[str, tuple[int, int]] | None = None) -> BatchPlan:
    """`tries`: task key -> (rollouts, solved ones) in all, for `unsolved_kinds`."""
    if not use_original:
        originals = []
    if not originals and not synthetic:
        return BatchPlan([], 0, 0, 0)
    unsolved = unsolved_kinds([*originals, *synthetic], tries or {}, curriculum)
    n_synthetic = round(size * ratio) if originals else size
    n_synthetic = min(n_synthetic, size) if synthetic else 0
    n_original = size - n_synthetic if originals else 0
    if not originals:
        n_synthetic = size
    picked_synthetic = weighted_sample(synthetic, task_weights(synthetic, rates, curriculum, unsolved), n_synthetic, rng)
    picked_original = weighted_sample(originals, task_weights(originals, rates, curriculum, unsolved), n_original, rng)
    tasks = picked_original + picked_synthetic
    rng.shuffle(tasks)
    in_band = sum(1 for t in tasks if (r := rates.get(task_key(t))) and r[1] and curriculum.low <= r[0] <= curriculum.high)
    return BatchPlan(tasks, len(picked_original), len(picked_synthetic), in_band, unsolved)
