"""What the ablation harness (benchmarks/science/ablation.py) and its report (benchmarks/science/ablation_report.py) share: the
rows of each protocol version, and the per-task metrics read from an evaluation's raw JSON.

An evaluation is `python -m trainer.evaluate`'s JSON (or one of a run summary's, by `summary_evaluation`):
`per_task` (the k scores of each task), `prompts`, `per_task_called` (whether each episode made a tool call),
`per_task_steps`, `per_task_invalid`, and the harness adds `kinds` (each task's kind, for the per-kind tables).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# ---------------------------------------------------------------------------------------------- rows

# v1 (examples/ablation/flights.yaml, frozen): AgentEvolver's rows; the mechanisms each trained row keeps on
# top of self-questioning (`grpo`: the environment's own train split, none of the three).
ROWS_V1: tuple[str, ...] = ("base", "q", "qn", "qa", "full", "grpo")
MECHANISMS_V1: dict[str, set[str]] = {"q": set(), "qn": {"experience"}, "qa": {"judge"},
                                      "full": {"experience", "judge"}, "grpo": set()}
LABELS_V1 = {"base": "base", "q": "+Q", "qn": "+Q&N", "qa": "+Q&A", "full": "full", "grpo": "GRPO (train split)"}


@dataclass(frozen=True)
class RowV2:
    """What one v2 row switches on. `warm_start`: the warm start's data (None: none); `rl`: GRPO steps after
    it (False: the warm-started policy is evaluated as it is); `tasks`: what RL trains on (`synthetic`: the task
    manager's tasks only, zero human data; `train`: the environment's own train split); `demonstrations`: the
    pool rollouts are shown (`synthetic`: the task manager's held-apart synthetic tasks; `train`: the
    environment's train-split references); `judge`: reference-guided attribution (ADCA-GRPO)."""

    label: str
    warm_start: Literal["synthetic", "environment"] | None
    rl: bool
    tasks: Literal["synthetic", "train"]
    demonstrations: Literal["synthetic", "train"] | None
    judge: bool
    estimator: Literal["gigpo"] | None = None  # v3: a judge-free step-credit estimator instead of GRPO


# v2 (issue 36), in priority order. The protocol's `run` section is the `w_full` row. Every W row with RL
# starts from the `w` row's weights and task store (computed once per seed), and `full` from its task store,
# so every synthetic-task row of a seed trains on the same synthetic tasks and pool.
ROWS_V2: dict[str, RowV2] = {
    #                 label        warm start      RL     tasks        demonstrations  judge
    "w":      RowV2("W",          "synthetic",    False, "synthetic", None,           False),
    "w_q":    RowV2("W+Q",        "synthetic",    True,  "synthetic", None,           False),
    "w_qn":   RowV2("W+Q&N",      "synthetic",    True,  "synthetic", "synthetic",    False),
    "w_qa":   RowV2("W+Q&A",      "synthetic",    True,  "synthetic", None,           True),
    "w_full": RowV2("W+full",     "synthetic",    True,  "synthetic", "synthetic",    True),
    "full":   RowV2("full (no W)", None,          True,  "synthetic", "synthetic",    True),
    "env_w":  RowV2("Env-W",      "environment",  False, "train",     None,           False),
    "env_n":  RowV2("Env+N",      None,           True,  "train",     "train",        False),
}
LABELS_V2 = {"base": "base", **{row: spec.label for row, spec in ROWS_V2.items()}}

# v3 (issue 51): the v2 rows that test N and A, on multi-call tasks, with GiGPO beside ADCA-GRPO as the
# judge-free step-credit baseline. Shared rows keep v2's spec.
ROWS_V3: dict[str, RowV2] = {
    "w": ROWS_V2["w"],
    "w_q": ROWS_V2["w_q"],
    "w_qa": ROWS_V2["w_qa"],
    "w_qg": RowV2("W+Q&G (GiGPO)", "synthetic", True, "synthetic", None, False, estimator="gigpo"),
    "w_qn": ROWS_V2["w_qn"],
    "w_full": ROWS_V2["w_full"],
}
LABELS_V3 = {"base": "base", **{row: spec.label for row, spec in ROWS_V3.items()}}
ROWS: dict[int, tuple[str, ...]] = {1: ROWS_V1, 2: ("base", *ROWS_V2), 3: ("base", *ROWS_V3)}
ROW_SPECS: dict[int, dict[str, RowV2]] = {2: ROWS_V2, 3: ROWS_V3}
LABELS = {**LABELS_V3, **LABELS_V2, **LABELS_V1}  # a v2 table labels its rows with LABELS_V2 (`full` differs)


def failed_run_lines(failed: list[dict[str, Any]], labels: dict[str, str]) -> list[str]:
    """One markdown bullet per run recorded as failed (a collapse stop: never rerun, never evaluated)."""
    return [f"- {labels[f['row']]} seed {f['seed']}: {f['reason']} ({f.get('signal')} at step {f.get('step')})"
            for f in failed]


def _spec(row: str) -> RowV2 | None:
    return ROWS_V3.get(row) or ROWS_V2.get(row)  # a row both versions have has one spec


def shares_warm_start(row: str) -> bool:
    """A v2/v3 row that starts from the `w` row's warm-started weights (computed once per seed)."""
    spec = _spec(row)
    return spec is not None and spec.warm_start == "synthetic" and spec.rl


def shares_task_store(row: str) -> bool:
    """A v2/v3 row that trains on the `w` row's synthetic tasks (its task store, copied) instead of its own."""
    spec = _spec(row)
    return spec is not None and row != "w" and spec.tasks == "synthetic"


# ---------------------------------------------------------------------------------------------- metrics


def successes(result: dict[str, Any], *, require_call: bool = False) -> dict[str, list[float]]:
    """Per task, 1.0 for each successful sample (score 1); with `require_call`, only where that episode made at
    least one tool call (a call-free guess counts 0)."""
    called = result.get("per_task_called")
    if require_call and called is None:
        raise ValueError("this evaluation did not record per_task_called; the strict metric needs it")
    out = {}
    for task, scores in result["per_task"].items():
        calls = called[task] if require_call else [True] * len(scores)
        if len(calls) != len(scores):
            raise ValueError(f"task {task}: {len(scores)} scores but {len(calls)} tool-call records")
        out[task] = [float(s >= 1.0 and c) for s, c in zip(scores, calls, strict=True)]
    return out


def per_task_metric(result: dict[str, Any], metric: str, *, require_call: bool = False) -> dict[str, float]:
    """avg: the success share of a task's k samples; best: whether any succeeded."""
    if metric not in ("avg", "best"):
        raise ValueError(f"metric {metric!r}: avg or best")
    return {task: sum(s) / len(s) if metric == "avg" else max(s)
            for task, s in successes(result, require_call=require_call).items()}


def summary_evaluation(summary: dict[str, Any], label: str) -> dict[str, Any]:
    """One evaluation of a run's summary.json (`before`, `warm_start`, `after`; an in-loop or an agent run's) in
    the shape of `python -m trainer.evaluate`'s JSON that the metrics here read."""
    per_task = ((summary.get("eval") or {}).get("per_task") or {}).get(label)
    if per_task is None:
        raise ValueError(f"the summary of {summary.get('output_dir')} has no {label!r} evaluation")
    return {"per_task": per_task["outcomes"], "per_task_called": per_task["called"],
            "prompts": per_task.get("prompts", {})}


def per_task_invalid(result: dict[str, Any]) -> dict[str, float] | None:
    """Per task, invalid steps / steps (None where the evaluation did not record it)."""
    return result.get("per_task_invalid")


def success_lengths(result: dict[str, Any]) -> dict[str, int] | None:
    """Successful samples by episode length (on a one-call lookup, length 1 is an answer without any call);
    None for an evaluation made before lengths were recorded."""
    steps = result.get("per_task_steps")
    if steps is None:
        return None
    counts: dict[str, int] = {}
    for task, scores in result["per_task"].items():
        for score, length in zip(scores, steps.get(task, []), strict=False):
            if score >= 1.0:
                counts[str(length)] = counts.get(str(length), 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0])))


def paired(before: dict[str, Any], after: dict[str, Any], metric: str, *, require_call: bool = False) -> list[float]:
    """After minus before, per task, over the tasks both evaluated with the same prompt."""
    a = per_task_metric(after, metric, require_call=require_call)
    b = per_task_metric(before, metric, require_call=require_call)
    differing = [t for t in a if t in b and before["prompts"].get(t) != after["prompts"].get(t)]
    if differing:
        raise ValueError(f"the prompts of {len(differing)} tasks differ between the evaluations (e.g. {differing[0]})")
    return [a[t] - b[t] for t in sorted(a) if t in b]
