"""Self-questioning feeds self-navigating: seed the experience pool from verified synthetic tasks.

Before training, each verified synthetic task's reference is replayed in a fresh instance of its seed
task (started with the synthetic query, as the trainer starts it), so the observations in the trajectory
are the environment's own; the trajectory goes to the experience manager's summarize route, which distils
it as it distils any rollout. The reference leaves the task manager only this way, towards the pool.

AgentEvolver's `init_exp_before_training` seeds its pool from rollouts on validation tasks. Here no
held-out task may reach the pool: `check_seedable` accepts only synthetic tasks whose seed task is in the
environment's train split, and refuses anything else by name, before anything is replayed or sent.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from common.schemas import ChatMessage, Step, Task, Trajectory
from task_manager.curriculum import task_kind
from task_manager.envs import EnvAccess
from task_manager.models import StoredTask
from task_manager.replay import replay


class SeedingRefused(ValueError):
    """A task that must not seed the pool (held out, or without a verified reference)."""


def check_seedable(stored: StoredTask | None, task_id: str, train_ids: set[str],
                   heldout: dict[str, str] | None = None) -> StoredTask:
    """The stored synthetic task when it may seed the pool; else SeedingRefused saying why.

    `heldout`: the environment's validation and test task ids -> their split, to name them in the refusal."""
    if stored is None:
        split = (heldout or {}).get(task_id)
        if split is not None:
            raise SeedingRefused(f"task {task_id!r} is a {split} task; validation or test tasks never seed the "
                                 "experience pool")
        raise SeedingRefused(f"task {task_id!r} is not a synthetic task of this task manager; only verified "
                             "synthetic tasks seed the experience pool")
    task = stored.task
    if not task.synthetic or stored.reference is None:
        raise SeedingRefused(f"task {task_id!r} has no verified reference; only verified synthetic tasks seed the pool")
    if task.split != "train":
        raise SeedingRefused(f"task {task_id!r} is in the {task.split} split; validation and test tasks never seed "
                             "the experience pool")
    if task.seed_task_id not in train_ids:
        raise SeedingRefused(f"synthetic task {task_id!r} was made from {task.seed_task_id!r}, which is not a train "
                             "task of its environment; tasks grown from held-out tasks never seed the pool")
    return stored


@dataclass
class SeedReport:
    candidates: int = 0  # verified synthetic tasks considered
    refused: int = 0  # left out by `check_seedable` (only when no ids were named)
    kept_for_training: int = 0  # left out as training tasks (`mixture.pool_share` > 0; only when no ids were named)
    replayed: int = 0  # references that replayed to their verified end state
    replay_failed: int = 0
    sent: int = 0  # trajectories sent to the experience manager
    experiences_created: int = 0
    experiences_updated: int = 0
    task_ids: list[str] = field(default_factory=list)  # the tasks whose trajectories were sent
    errors: list[str] = field(default_factory=list)


async def reference_trajectory(access: EnvAccess, stored: StoredTask) -> Trajectory | None:
    """The reference replayed in a fresh instance, as a trajectory with real observations; None when the
    replay no longer reaches the verified end state."""
    task, reference = stored.task, stored.reference
    assert reference is not None and task.seed_task_id is not None
    result = await replay(access, task.env_type, task.seed_task_id, reference.actions, query=task.query,
                          recorded_initial_state=reference.initial_state, recorded_observations=reference.observations)
    if not result.ok:
        return None
    if reference.end_state is not None and access.comparable(result.end_state) != reference.end_state:
        return None
    messages = [ChatMessage.model_validate(m) for m in result.messages]
    steps = [Step(index=i, action=ChatMessage(role="assistant", content=action),
                  observation=ChatMessage(role="tool", content=observation))
             for i, (action, observation) in enumerate(zip(result.executed, result.observations, strict=True))]
    if result.ended and steps:
        # A lookup ends with its closing text reply; what the environment says after it ("Thank you, that is
        # all.") is no observation, and a demonstration ending on it would stand between it and the next query.
        steps[-1] = steps[-1].model_copy(update={"observation": None, "done": True})
    messages += [m for s in steps for m in (s.action, s.observation) if m is not None]
    return Trajectory(task_id=task.task_id, env_type=task.env_type, messages=messages, steps=steps, outcome=1.0,
                      metadata={"synthetic": True, "seeded_from": "reference", "query": task.query,
                                "seed_task_id": task.seed_task_id,
                                # the experience manager keeps one demonstration per kind, never merging kinds
                                **({"task_kind": task.metadata["task_kind"]} if task.metadata.get("task_kind") else {})})


async def seed_pool(access: EnvAccess, stored: list[StoredTask], experience: Any, workspace: str, *,
                    request_id: str | None = None, report: SeedReport | None = None) -> SeedReport:
    """Replay each task's reference and summarize the trajectories into `workspace` of `experience`
    (an `ExperienceClient`). The tasks must have passed `check_seedable`."""
    report = report or SeedReport()
    trajectories = []
    for item in stored:
        trajectory = await reference_trajectory(access, item)
        if trajectory is None:
            report.replay_failed += 1
            continue
        report.replayed += 1
        trajectories.append(trajectory)
    if trajectories:
        result = await experience.summarize(workspace, trajectories, request_id=request_id)
        report.sent = len(trajectories)
        report.task_ids = [t.task_id for t in trajectories]
        report.experiences_created = len(result.created)
        report.experiences_updated = len(result.updated)
        report.errors = list(result.errors)[:10]
    return report


def _norm(value: object) -> str:
    return " ".join(str(value).lower().split())


def giveaway(stored: StoredTask) -> str:
    """What a demonstration of the task gives away: a lookup's answer (two questions with one answer, such as
    the ids and names forms of one question, share it), else the task itself."""
    answer = stored.reference.answer if stored.reference is not None else None
    return "answer:" + _norm(answer) if answer is not None else "task:" + stored.task.task_id


def shown_records(stored: StoredTask) -> list[set[str]]:
    """The records a demonstration of the task shows: each JSON object in its observations, as the set of its
    scalar values (a passenger, one flight of a search)."""
    reference = stored.reference
    stack: list[object] = []
    for text in reference.observations if reference is not None else []:
        try:
            stack.append(json.loads(text))
        except (TypeError, ValueError):
            continue
    records: list[set[str]] = []
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            records.append({_norm(v) for v in item.values()
                            if v is not None and not isinstance(v, (bool, dict, list))})
            stack.extend(v for v in item.values() if isinstance(v, (dict, list)))
    return records


def gives_away(records: list[set[str]], task: StoredTask) -> bool:
    """Whether one shown record holds the task's answer next to something its query names (the same passenger
    or flight): an equal value on another record (two passengers with the same credit) is chance, not a leak."""
    answer = task.reference.answer if task.reference is not None else None
    if answer is None:
        return False
    answer, query = _norm(answer), _norm(task.task.query or "")
    return any(answer in record and any(len(v) >= 3 and v != answer and re.search(rf"(?<!\w){re.escape(v)}(?!\w)", query)
                                        for v in record)
               for record in records)


@dataclass
class PoolSplit:
    pool: set[str]  # seed the experience pool
    withheld: set[str]  # neither: their answer is shown by a pool demonstration
    training: set[str]


def split_for_pool(stored: list[StoredTask], share: float) -> PoolSplit:
    """`mixture.pool_share`: which synthetic tasks seed the pool and which are trained on.

    Per kind (a lookup's kind, or `goal`), tasks are grouped by their giveaway and the groups ordered by a hash
    of it; the first `round(share * groups)` of each kind (at least one where a kind has two groups or more) go
    to the pool, so every kind with room has a demonstration. A remaining task whose answer a pool
    demonstration shows (the same passenger's record, a search listing the flight: `gives_away`) is withheld
    from training too: copying it from the demonstration would be rewarded."""
    if share <= 0:
        return PoolSplit(set(), set(), {s.task.task_id for s in stored})
    kinds: dict[str, dict[str, list[StoredTask]]] = {}
    for item in stored:
        kind = task_kind(item.task) or "goal"
        kinds.setdefault(kind, {}).setdefault(giveaway(item), []).append(item)
    pool: list[StoredTask] = []
    for kind, groups in sorted(kinds.items()):
        order = sorted(groups, key=lambda g: hashlib.sha256(f"{kind}:{g}".encode()).hexdigest())
        take = max(1, round(share * len(order))) if len(order) >= 2 else 0
        pool += [item for g in order[:take] for item in groups[g]]
    pool_ids = {item.task.task_id for item in pool}
    shown = [record for item in pool for record in shown_records(item)]
    withheld = {item.task.task_id for item in stored if item.task.task_id not in pool_ids and gives_away(shown, item)}
    training = {item.task.task_id for item in stored} - pool_ids - withheld
    return PoolSplit(pool_ids, withheld, training)


def seedable_tasks(synthetic: list[Task], train_ids: set[str]) -> list[str]:
    """Ids of the synthetic tasks whose seed task is a train task (the default selection)."""
    return [t.task_id for t in synthetic if t.split == "train" and t.seed_task_id in train_ids]


def kinds_in_turn(stored: list[StoredTask]) -> list[StoredTask]:
    """`stored` taken one task of each kind in turn (kinds in order of first appearance), so that the first N
    hold every kind they can: a limited warm start is not all of the kind the explorer happens to reach most."""
    by_kind: dict[str, list[StoredTask]] = {}
    for item in stored:
        by_kind.setdefault(str(item.task.metadata.get("task_kind") or task_kind(item.task) or "goal"), []).append(item)
    queues = list(by_kind.values())
    return [queue[i] for i in range(max(map(len, queues), default=0)) for queue in queues if i < len(queue)]
