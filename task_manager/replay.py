"""Replay a sequence of actions in a fresh instance, carrying generated ids across runs.

A recorded action may use a value the environment generated in the recorded run (an order
number with a random salt). The same action in a fresh instance needs the fresh run's value.
`IdRemapper` learns old -> new by aligning what the recorded run saw with what the replay sees
(the initial state, then each observation) token by token: where the two differ in a token of
the same position, the recorded token maps to the replayed one.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from task_manager.envs import EnvAccess

_TOKENS = re.compile(r"[A-Za-z0-9_\-.:@]+")


class IdRemapper:
    def __init__(self) -> None:
        self.mapping: dict[str, str] = {}

    def learn(self, recorded: Any, replayed: Any) -> None:
        a = _TOKENS.findall(_text(recorded))
        b = _TOKENS.findall(_text(replayed))
        matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
        for op, i1, i2, j1, j2 in matcher.get_opcodes():
            if op == "replace" and i2 - i1 == j2 - j1:
                for old, new in zip(a[i1:i2], b[j1:j2], strict=True):
                    # Only id-like tokens: a changed number or word is a different outcome, not a new id.
                    if old != new and _id_like(old) and _id_like(new) and old not in self.mapping.values():
                        self.mapping[old] = new

    def apply(self, text: str) -> str:
        if not self.mapping:
            return text
        pattern = re.compile(r"(?<![A-Za-z0-9_\-])(" + "|".join(map(re.escape, sorted(self.mapping, key=len,
                                                                                         reverse=True))) + r")(?![A-Za-z0-9_\-])")
        return pattern.sub(lambda m: self.mapping[m.group(1)], text)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _id_like(token: str) -> bool:
    return any(c.isdigit() for c in token) and any(c.isalpha() for c in token) and len(token) >= 4


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
