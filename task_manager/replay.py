"""Replay a sequence of actions in a fresh instance, carrying generated ids across runs.

A recorded action may use a value the environment generated in the recorded run (an order number with a random
salt); the replay learns the fresh run's values from the initial state and each observation, by the rule in
`common.generated_ids` (the gateway's scripted episodes use the same rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from common.generated_ids import IdRemapper
from task_manager.envs import EnvAccess


@dataclass
class ReplayResult:
    ok: bool
    failed_at: int | None = None
    error: str = ""
    executed: list[str] = field(default_factory=list)  # the actions as sent (ids remapped)
    observations: list[str] = field(default_factory=list)
    initial_state: Any = None
    end_state: Any = None  # full snapshot after the last action
    generated: set[str] = field(default_factory=set)  # recorded values that turned out to be generated
    messages: list[dict[str, Any]] = field(default_factory=list)  # the instance's opening messages (system, user)
    ended: bool = False  # the environment ended the episode at the last action (a closing text reply)


async def replay(access: EnvAccess, env_type: str, seed_task_id: str, actions: list[str], *,
                 query: str | None = None, recorded_initial_state: Any = None,
                 recorded_observations: list[str] | None = None) -> ReplayResult:
    """Run `actions` in a fresh instance; stop at the first failed step."""
    remapper = IdRemapper()
    async with access.instance(env_type, seed_task_id, query) as instance:
        initial = await instance.snapshot()
        if recorded_initial_state is not None and initial is not None:
            remapper.learn(recorded_initial_state, initial)
        result = ReplayResult(ok=True, initial_state=initial, messages=list(instance.messages))
        for i, action in enumerate(actions):
            sent = remapper.apply(action)
            outcome = await instance.step(sent)
            result.executed.append(sent)
            result.observations.append(outcome.observation)
            if outcome.failed:
                result.ok, result.failed_at, result.error = False, i, outcome.observation[:300]
                break
            if recorded_observations is not None and i < len(recorded_observations):
                remapper.learn(recorded_observations[i], outcome.observation)
            result.ended = outcome.done
            if outcome.done and i + 1 < len(actions):
                result.ok, result.failed_at, result.error = False, i, "the episode ended before the last action"
                break
        result.end_state = await instance.snapshot()
        result.generated = set(remapper.mapping)
        return result
