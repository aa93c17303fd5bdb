"""The v3 pilot's go/no-go (issue 51), from the raw JSON of its runs alone (`ablation.py --pilot`: validation,
one seed, the rows `w` and `w_q`, and `w_qa` when run).

Per task kind, a go needs both:
- room for RL: at least `MIN_MIXED_SHARE` of W+Q's training groups had mixed outcomes (the only groups where an
  outcome-based advantage is not zero);
- W's validation success (strict avg@k over the kind's tasks) within `W_SUCCESS_RANGE`: below it RL has nothing
  to reinforce, above it nothing left to gain.
Beside it, what sizing the full grid needs: minutes per training step and per row, a per-seed estimate, the
per-task spread of W and of W+Q, and W+Q - W paired per task with its smallest detectable difference at 80%
power (on the validation tasks, and scaled to the test split's size). With W+Q&A run: A's room to act per kind
(the share of labelled steps whose label disagrees with the outcome; under `MIN_ROOM_TO_ACT`: "no room").
"""

from __future__ import annotations

import math
from typing import Any

from benchmarks.science.ablation_common import per_task_metric
from benchmarks.science.ablation_criteria import Runs, compare, detectable_difference, sample_sd

MIN_MIXED_SHARE = 0.30
W_SUCCESS_RANGE = (0.10, 0.90)
MIN_ROOM_TO_ACT = 0.10


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def success_by_kind(evaluation: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per task kind (and `all`): tasks, strict avg@k (mean over the kind's tasks of its success share) and the
    sd of the per-task values."""
    per_task = per_task_metric(evaluation, "avg", require_call=True)
    kinds = evaluation.get("kinds") or {}
    grouped: dict[str, list[float]] = {"all": list(per_task.values())}
    for task, value in per_task.items():
        grouped.setdefault(kinds.get(task, "unknown"), []).append(value)
    return {kind: {"tasks": len(v), "strict_avg": _mean(v), "sd": sample_sd(v)} for kind, v in sorted(grouped.items())}


def _verdict(w_success: float | None, mixed_share: float | None) -> str:
    low, high = W_SUCCESS_RANGE
    if w_success is None or mixed_share is None:
        return "pending"
    return "go" if low <= w_success <= high and mixed_share >= MIN_MIXED_SHARE else "no-go"


def _room(share: float | None) -> str:
    if share is None:
        return "-"
    return f"{share:.2f}" + (" (no room)" if share < MIN_ROOM_TO_ACT else "")


def pilot_summary(runs: Runs, seed: int, test_tasks: int, protocol_rows: list[str],
                  base_minutes: float | None = None, trained: dict[str, dict[str, Any]] | None = None
                  ) -> dict[str, Any]:
    """`runs`: row -> seed -> raw JSON (`w`, `w_q`, optionally `w_qa`); `test_tasks`: the frozen evaluation's task
    count, for the detectable difference there; `protocol_rows`: the trained rows of a full seed, and
    `base_minutes`: the seed's start evaluation, for a seed's minutes. Those are a floor: the rows with a judge or
    a pool take longer than W+Q, and the frozen protocol evaluates more tasks (the test split, tier 1 too).
    `trained`: row -> `{"rollouts": ..., "step_s": [...]}` of a row trained but not evaluated yet, so that the
    training's numbers come before the evaluations'."""
    trained = trained or {}
    w, w_q, w_qa = (runs.get(row, {}).get(seed) for row in ("w", "w_q", "w_qa"))
    w_success = success_by_kind(w["eval_end"]) if w else {}
    w_q_training = w_q or trained.get("w_q")
    mixed = (w_q_training.get("rollouts") or {}).get("mixed_outcome_groups", {}) if w_q_training else {}
    w_qa_training = w_qa or trained.get("w_qa")
    room = ((w_qa_training.get("rollouts") or {}).get("room_to_act") or {}) if w_qa_training else {}
    kinds = sorted(set(w_success) | set(mixed) | set(room))
    per_kind = {}
    for kind in kinds:
        success = (w_success.get(kind) or {}).get("strict_avg")
        # a kind W+Q never trained on (no synthetic task of it) had no room for RL at all
        share = (mixed.get(kind) or {}).get("share", 0.0 if w_q_training else None)
        per_kind[kind] = {"w_success": success, "w_tasks": (w_success.get(kind) or {}).get("tasks", 0),
                          "mixed_share": share, "mixed_groups": (mixed.get(kind) or {}).get("groups", 0),
                          "room_to_act": (room.get(kind) or {}).get("share"),
                          "verdict": _verdict(success, share)}
    paired = compare(runs, "w", "w_q") if w and w_q else None
    if paired is not None:
        paired["detectable_at_test_size"] = detectable_difference(paired["sd"], test_tasks)
    minutes = {row: data[seed].get("minutes") for row, data in runs.items() if seed in data}
    step_s = ((w_q or {}).get("train") or trained.get("w_q") or {}).get("step_s") or []
    per_seed = None
    if w and w_q:
        rl_rows = [r for r in protocol_rows if r not in ("base", "w")]
        per_seed = (base_minutes or 0.0) + w["minutes"]["total"] + len(rl_rows) * w_q["minutes"]["total"]
    return {"seed": seed, "rows": sorted(r for r in runs if seed in runs[r]), "trained_only": sorted(trained),
            "thresholds": {"mixed_share_at_least": MIN_MIXED_SHARE, "w_success_within": list(W_SUCCESS_RANGE),
                           "room_to_act_at_least": MIN_ROOM_TO_ACT},
            "per_kind": per_kind,
            "go_kinds": [k for k, v in per_kind.items() if k != "all" and v["verdict"] == "go"],
            "w_success": w_success, "w_q_success": success_by_kind(w_q["eval_end"]) if w_q else None,
            "w_q_minus_w": paired, "minutes": minutes, "base_minutes": base_minutes,
            "minutes_per_step": _mean(step_s) / 60 if step_s else None,
            "minutes_per_seed_floor": per_seed}


def pilot_lines(summary: dict[str, Any]) -> list[str]:
    """The go/no-go as printed lines, one per kind, then the sizing numbers."""
    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = [f"kind: W success (need {W_SUCCESS_RANGE[0]:.2f}-{W_SUCCESS_RANGE[1]:.2f}), mixed groups "
             f"(need >= {MIN_MIXED_SHARE:.2f}), A's room to act -> verdict"]
    for kind, v in summary["per_kind"].items():
        lines.append(f"{kind}: {cell(v['w_success'])} of {v['w_tasks']} tasks, {cell(v['mixed_share'])} of "
                     f"{v['mixed_groups']} groups, room {_room(v['room_to_act'])} -> {v['verdict']}")
    paired = summary["w_q_minus_w"]
    if paired is not None:
        detectable = paired["detectable"]
        lines.append(f"W+Q - W: {paired['mean']:+.3f} [{paired['lo']:+.3f}, {paired['hi']:+.3f}] over {paired['n']} "
                     f"tasks, sd {paired['sd']:.3f}, detectable {'-' if math.isinf(detectable) else f'{detectable:.3f}'}"
                     f" (at the test size {paired['detectable_at_test_size']:.3f})")
    if summary["minutes_per_step"] is not None:
        lines.append(f"minutes: {summary['minutes_per_step']:.2f} per W+Q step")
    if summary["minutes_per_seed_floor"] is not None:
        lines.append(f"minutes: at least {summary['minutes_per_seed_floor']:.1f} per seed")
    return lines
