"""Scoring the pool by use: feedback updates an experience's usage (what retrieval's utility term reads),
and the archive rules retire experiences that do not help or that overflow the active cap.

Each function plans a mutation (a `Plan`) from the in-memory index; the engine makes it durable.
"""

from __future__ import annotations

import time
from typing import Any

from common.schemas import Experience
from experience_manager.durable import Plan
from experience_manager.index import WorkspaceIndex
from experience_manager.settings import ScoringSettings


def archive_reason(scoring: ScoringSettings, experience: Experience) -> str | None:
    """Why this experience should be archived, or None to keep it."""
    usage = experience.usage
    if usage.uses < scoring.min_uses:
        return None
    if usage.advantage_count >= scoring.min_uses:
        mean = usage.mean_advantage or 0.0
        return f"mean advantage {mean:.3f} < {scoring.advantage_margin}" if mean < scoring.advantage_margin else None
    if usage.utility < scoring.utility_floor:
        return f"utility {usage.utility:.3f} < {scoring.utility_floor} without enough baselines"
    return None


def cap_overflow(scoring: ScoringSettings, index: WorkspaceIndex | None, new_active: int,
                 staged: dict[str, Experience]) -> list[Experience]:
    """The least useful active experiences to archive so the pool stays within max_active."""
    active = [staged.get(e.experience_id, e) for e in (index.experiences.values() if index else ())]
    active = [e for e in active if e.status == "active"]
    overflow = len(active) + new_active - scoring.max_active
    if overflow <= 0:
        return []
    active.sort(key=lambda e: (e.usage.utility, e.updated_at))
    now = time.time()
    return [e.model_copy(update={"status": "archived", "updated_at": now}) for e in active[:overflow]]


def plan_feedback(index: WorkspaceIndex, items: list[dict[str, Any]], *, success_threshold: float,
                  scoring: ScoringSettings) -> Plan:
    """Count one use per (item, experience), with its success, reward and advantage over the baseline."""
    staged: dict[str, Experience] = {}
    unknown: list[str] = []
    now = time.time()
    for item in items:
        reward = float(item["reward"])
        success = item.get("success")
        success = reward >= success_threshold if success is None else bool(success)
        baseline = item.get("baseline")
        for experience_id in dict.fromkeys(item["experience_ids"]):
            experience = staged.get(experience_id) or index.experiences.get(experience_id)
            if experience is None:
                unknown.append(experience_id)
                continue
            usage = experience.usage.model_copy(update={
                "uses": experience.usage.uses + 1,
                "successes": experience.usage.successes + int(success),
                "reward_sum": experience.usage.reward_sum + reward,
            })
            if baseline is not None:
                usage.advantage_sum += reward - float(baseline)
                usage.advantage_count += 1
            staged[experience_id] = experience.model_copy(update={"usage": usage, "updated_at": now})
    archived = []
    if scoring.auto_prune:
        for experience_id, experience in staged.items():
            reason = archive_reason(scoring, experience) if experience.status == "active" else None
            if reason:
                staged[experience_id] = experience.model_copy(update={"status": "archived"})
                archived.append({"experience_id": experience_id, "reason": reason})
    result = {"workspace_id": index.workspace_id, "updated": len(staged), "archived": archived,
              "unknown_ids": list(dict.fromkeys(unknown)),
              "usage": {k: {"uses": e.usage.uses, "successes": e.usage.successes,
                            "utility": round(e.usage.utility, 5), "mean_advantage": e.usage.mean_advantage,
                            "status": e.status} for k, e in staged.items()}}
    return Plan(result=result, upserts=[(e, None) for e in staged.values()])


def plan_prune(index: WorkspaceIndex, *, dry_run: bool, scoring: ScoringSettings) -> Plan:
    """Archive what the rules retire, then the least useful beyond max_active."""
    now = time.time()
    archived: dict[str, Experience] = {}
    reasons = []
    for experience in index.experiences.values():
        reason = archive_reason(scoring, experience) if experience.status == "active" else None
        if reason:
            archived[experience.experience_id] = experience.model_copy(
                update={"status": "archived", "updated_at": now})
            reasons.append({"experience_id": experience.experience_id, "reason": reason})
    for experience in cap_overflow(scoring, index, 0, archived):
        archived[experience.experience_id] = experience
        reasons.append({"experience_id": experience.experience_id, "reason": "active pool over max_active"})
    result = {"workspace_id": index.workspace_id, "dry_run": dry_run, "archived": reasons,
              "active_after": index.n_active - len(archived)}
    return Plan(result=result, upserts=[(e, None) for e in archived.values()])
