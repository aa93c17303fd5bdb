"""How well step labels agree with ground truth: balanced accuracy, Cohen's kappa, per-class recall, and
95% bootstrap intervals that resample whole tasks (a task's steps and trajectories are not independent).

Also the ground-truth fixture (benchmarks/fixtures/judge_step_labels_v*.jsonl, made by
benchmarks/science/judge_labels.py) and the three baselines every judge is compared with.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

Label = Literal["GOOD", "BAD"]
FIXTURES = Path(__file__).resolve().parents[1] / "benchmarks" / "fixtures"
DEFAULT_FIXTURE = FIXTURES / "judge_step_labels_v1.jsonl"


class LabelledStep(BaseModel):
    action: str
    observation: str | None = None


class LabelledTrajectory(BaseModel):
    trajectory_id: str
    env: str
    task_id: str
    source: str
    split: Literal["dev", "test"]
    query: str
    steps: list[LabelledStep]
    outcome: float
    labels: list[Label]


def load_fixture(path: Path = DEFAULT_FIXTURE, split: str | None = "test") -> list[LabelledTrajectory]:
    """The labelled trajectories of one half (`dev`, `test`) or, with None, of both."""
    rows = [LabelledTrajectory.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]
    for row in rows:
        if len(row.labels) != len(row.steps):
            raise ValueError(f"{path}: {row.trajectory_id} has {len(row.steps)} steps but {len(row.labels)} labels")
    return [r for r in rows if split is None or r.split == split]


def recall(truth: Sequence[str], predicted: Sequence[str], label: str) -> float | None:
    hits = [p == label for t, p in zip(truth, predicted, strict=True) if t == label]
    return sum(hits) / len(hits) if hits else None


def balanced_accuracy(truth: Sequence[str], predicted: Sequence[str]) -> float:
    """The mean of GOOD and BAD recall: a constant labeller scores 0.5 whatever the class balance."""
    recalls = [r for r in (recall(truth, predicted, "GOOD"), recall(truth, predicted, "BAD")) if r is not None]
    return sum(recalls) / len(recalls) if recalls else 0.0


def cohen_kappa(truth: Sequence[str], predicted: Sequence[str]) -> float:
    n = len(truth)
    if n == 0:
        return 0.0
    observed = sum(t == p for t, p in zip(truth, predicted, strict=True)) / n
    expected = sum((list(truth).count(c) / n) * (list(predicted).count(c) / n) for c in ("GOOD", "BAD"))
    return 0.0 if expected >= 1.0 else (observed - expected) / (1.0 - expected)


Metric = Callable[[Sequence[str], Sequence[str]], float]


def bootstrap_ci(groups: list[tuple[list[str], list[str]]], metric: Metric, samples: int = 2000,
                 seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of `metric` over resamples of whole groups (tasks) with replacement."""
    rng = random.Random(seed)
    values = []
    for _ in range(samples):
        truth: list[str] = []
        predicted: list[str] = []
        for _ in groups:
            t, p = groups[rng.randrange(len(groups))]
            truth += t
            predicted += p
        values.append(metric(truth, predicted))
    values.sort()
    return values[int(0.025 * (samples - 1))], values[int(0.975 * (samples - 1))]


def report(trajectories: list[LabelledTrajectory], predicted: dict[str, list[str]], samples: int = 2000,
           seed: int = 0) -> dict:
    """Agreement of `predicted` (labels by trajectory id) with the ground truth, CIs by task."""
    by_task: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    for traj in trajectories:
        truth, pred = by_task.setdefault((traj.env, traj.task_id), ([], []))
        truth += traj.labels
        pred += predicted[traj.trajectory_id]
    groups = list(by_task.values())
    truth = [t for g in groups for t in g[0]]
    pred = [p for g in groups for p in g[1]]
    ba, kappa = balanced_accuracy(truth, pred), cohen_kappa(truth, pred)
    return {"steps": len(truth), "balanced_accuracy": round(ba, 4),
            "balanced_accuracy_ci95": [round(v, 4) for v in bootstrap_ci(groups, balanced_accuracy, samples, seed)],
            "kappa": round(kappa, 4),
            "kappa_ci95": [round(v, 4) for v in bootstrap_ci(groups, cohen_kappa, samples, seed)],
            "recall_good": _round(recall(truth, pred, "GOOD")), "recall_bad": _round(recall(truth, pred, "BAD")),
            "predicted_good_rate": round(pred.count("GOOD") / len(pred), 4) if pred else 0.0}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def baselines(trajectories: list[LabelledTrajectory], success_threshold: float = 0.5,
              seed: int = 0) -> dict[str, dict[str, list[str]]]:
    """Labels of the three reference labellers: the outcome's sign, always GOOD, and a fair coin."""
    rng = random.Random(seed)
    return {
        "outcome_sign": {t.trajectory_id: ["GOOD" if t.outcome > success_threshold else "BAD"] * len(t.steps)
                         for t in trajectories},
        "always_good": {t.trajectory_id: ["GOOD"] * len(t.steps) for t in trajectories},
        "random": {t.trajectory_id: [rng.choice(("GOOD", "BAD")) for _ in t.steps] for t in trajectories},
    }


def fixture_summary(trajectories: list[LabelledTrajectory]) -> dict:
    labels = [lab for t in trajectories for lab in t.labels]
    return {"trajectories": len(trajectories), "tasks": len({(t.env, t.task_id) for t in trajectories}),
            "steps": len(labels), "good": labels.count("GOOD"), "bad": labels.count("BAD"),
            "successes": sum(t.outcome > 0.5 for t in trajectories)}
