"""What a run's training rollouts say about the room each mechanism had, from the run folder's rollout records
(`<trainer>/rollouts/shard-*.jsonl`, written by `trainer.records`): per task kind, the groups whose outcomes
differed (the only ones where an outcome-based advantage is not zero), and A's room to act, the labelled steps
whose judge label disagrees with their trajectory's outcome (a GOOD step in a failed trajectory, a BAD step in
a successful one): where every label repeats the outcome, step credit can only rescale the outcome's signal.

A task's kind is its `task_kind` up to the first `:` (a synthetic task's label is `kind:calls:form`, e.g.
`cancel_by_id:list_orders(passenger_id) > cancel_order(order_id):ids`), so the training kinds read as the
environment's own task kinds. A trajectory succeeded when its outcome is at least 1 (the metric's rule).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainer.records import shard_paths

UNKNOWN_KIND = "unknown"


def kind_of(task_kind: str | None) -> str:
    return (task_kind or UNKNOWN_KIND).split(":", 1)[0] or UNKNOWN_KIND


def read_records(rollouts_dir: Path, groups_per_step: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """The rollout records of the run's training steps, in the order written. A step trained again after a
    resume (its records were written, its checkpoint was not) is in the shards twice, with new group ids:
    given each step's group count (`rollout/groups` of the step's last metrics record), only its last that
    many groups are kept."""
    records = [json.loads(line) for shard in shard_paths(rollouts_dir)
               for line in shard.read_text().splitlines() if line.strip()]
    if not groups_per_step:
        return records
    kept_groups: set[tuple[int, str]] = set()
    for step in {r["step"] for r in records}:
        order = list(dict.fromkeys(str(r["group_id"]) for r in records if r["step"] == step))
        count = groups_per_step.get(step, len(order))
        kept_groups.update((step, g) for g in order[max(0, len(order) - count):])
    return [r for r in records if (r["step"], str(r["group_id"])) in kept_groups]


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _succeeded(record: dict[str, Any]) -> bool:
    return float(record.get("outcome") or 0.0) >= 1.0


def mixed_outcome_by_kind(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kind (and `all`): groups, groups whose outcomes differ, and their share. A group is one task's
    rollouts in one step (`group_id` of that step)."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault((record["step"], str(record["group_id"])), []).append(record)
    counts: dict[str, list[int]] = {}
    for members in groups.values():
        mixed = len({float(r.get("outcome") or 0.0) for r in members}) > 1
        for kind in (kind_of(members[0].get("task_kind")), "all"):
            tally = counts.setdefault(kind, [0, 0])
            tally[0] += 1
            tally[1] += int(mixed)
    return {kind: {"groups": g, "mixed": m, "share": _share(m, g)} for kind, (g, m) in sorted(counts.items())}


def room_to_act_by_kind(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]] | None:
    """Per kind (and `all`): labelled steps, those whose label disagrees with the trajectory's outcome (GOOD in
    a failed one, BAD in a successful one) and their share; None when no rollout was labelled (no judge)."""
    counts: dict[str, list[int]] = {}
    for record in records:
        labels = record.get("labels")
        if labels is None:
            continue
        success = _succeeded(record)
        against = sum(1 for label in labels if (label["label"] == "GOOD") != success)
        for kind in (kind_of(record.get("task_kind")), "all"):
            tally = counts.setdefault(kind, [0, 0])
            tally[0] += len(labels)
            tally[1] += against
    if not counts:
        return None
    return {kind: {"steps": n, "against_outcome": a, "share": _share(a, n)} for kind, (n, a) in sorted(counts.items())}


def rollout_stats(rollouts_dir: Path, groups_per_step: dict[int, int] | None = None) -> dict[str, Any]:
    """The run's training rollouts: counts, the mixed-outcome groups and A's room to act, per kind.
    `groups_in_metrics`: the groups the metrics counted, to compare with the groups found (a shard rotated away
    by `trainer.records` would leave fewer)."""
    records = read_records(rollouts_dir, groups_per_step)
    return {"rollouts": len(records), "steps": len({r["step"] for r in records}),
            "groups_in_metrics": sum(groups_per_step.values()) if groups_per_step else None,
            "success_share": _share(sum(_succeeded(r) for r in records), len(records)),
            "mixed_outcome_groups": mixed_outcome_by_kind(records),
            "room_to_act": room_to_act_by_kind(records)}
