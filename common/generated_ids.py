"""Generated ids across two runs of the same calls: one rule, shared by the task manager's replay and the gateway.

A recorded action may use a value the environment generated in the recorded run (an order number with a random
salt). The same action in a fresh instance needs the fresh run's value. `IdRemapper` learns old -> new by
aligning what the recorded run saw with what the other run sees (an initial state, then each result) token by
token: where the two differ in a token of the same position, and both tokens look like ids, the recorded token
maps to the new one. A changed plain number or word is a different outcome, never an id.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence
from typing import Any

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
                    if old != new and _id_like(old) and _id_like(new) and old not in self.mapping.values():
                        self.mapping[old] = new

    def apply(self, text: str) -> str:
        if not self.mapping:
            return text
        pattern = re.compile(r"(?<![A-Za-z0-9_\-])(" + "|".join(map(re.escape, sorted(self.mapping, key=len,
                                                                                         reverse=True))) + r")(?![A-Za-z0-9_\-])")
        return pattern.sub(lambda m: self.mapping[m.group(1)], text)


def learned(recorded: Sequence[Any], replayed: Sequence[Any]) -> IdRemapper:
    """The ids learned from pairs of results, in order (the shorter sequence sets how many pairs)."""
    remapper = IdRemapper()
    for old, new in zip(recorded, replayed, strict=False):
        remapper.learn(old, new)
    return remapper


def same_but_generated_ids(recorded: Sequence[str], replayed: Sequence[str]) -> bool:
    """Whether a run's results are the recorded run's, each generated id replaced by one value throughout
    (the order booked in one run is the order cancelled in it)."""
    if len(recorded) != len(replayed):
        return False
    remapper = learned(recorded, replayed)
    return all(remapper.apply(old) == new for old, new in zip(recorded, replayed, strict=True))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _id_like(token: str) -> bool:
    return any(c.isdigit() for c in token) and any(c.isalpha() for c in token) and len(token) >= 4
