"""Values seen while exploring, for filling tool arguments with things the environment knows.

Observations are harvested two ways: JSON fields by key (a `flight_id` in a search result is a
candidate for a `flight_id` argument) and id-like tokens in any text (codes, ids, dates, full
names). Each value remembers the step it was seen at, so the depth phase can prefer values from
the last k observations.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_TOKEN = re.compile(
    r"\b\d{4}-\d{2}-\d{2}\b"  # dates
    r"|\b[A-Z][A-Za-z]*\d[A-Za-z0-9\-]*\b"  # ids with a digit: P1001, UA123-0603, ORD1001AB
    r"|\b[A-Z]{2,5}\b"  # codes: SFO
    r"|\b[A-Z][a-z]+ [A-Z][a-z]+\b"  # full names: Alice Wang
)
_EXAMPLE = re.compile(r"e\.g\.\s*([^\s,;)]+(?: [A-Z][a-z]+)?)")
# Format placeholders in a description ("YYYY-MM-DD", "HH:MM") stand for digits.
_FORMAT = re.compile(r"\b(?:[YMDHS]{1,4}[-:/.]){1,3}[YMDHS]{1,4}\b")


def shape(value: str) -> str:
    """A value's character classes: 'UA123-0603' -> 'A9-9', 'Alice Wang' -> 'Aa Aa'."""
    out = re.sub(r"[A-Z]+", "A", value)
    out = re.sub(r"[a-z]+", "a", out)
    return re.sub(r"\d+", "9", out)


def examples_in(description: str) -> list[str]:
    """Example values a tool doc gives ("IATA code, e.g. SFO")."""
    return [m.strip(".'\"") for m in _EXAMPLE.findall(description or "")]


def shapes_in(description: str) -> set[str]:
    """The shapes a described value may take: its examples', and its formats' ("YYYY-MM-DD" -> "9-9-9")."""
    found = {shape(e) for e in examples_in(description)}
    found |= {shape(re.sub(r"[YMDHS]", "0", f)) for f in _FORMAT.findall(description or "")}
    return found


@dataclass
class ValuePool:
    by_key: dict[str, dict[Any, int]] = field(default_factory=dict)  # key -> value -> last step seen
    tokens: dict[str, int] = field(default_factory=dict)  # token -> last step seen
    salient: set[str] = field(default_factory=set)  # tokens of the task's own request: likely to matter together

    def harvest_request(self, text: str) -> None:
        self.harvest(text, -1)
        self.salient |= set(_TOKEN.findall(text or ""))

    def harvest(self, text: str, step: int) -> None:
        try:
            data = json.loads(text)
        except (ValueError, TypeError):
            data = None
        if data is not None:
            self._walk(data, step)
        for token in _TOKEN.findall(text or ""):
            self.tokens[token] = step

    def _walk(self, data: Any, step: int, key: str | None = None) -> None:
        if isinstance(data, dict):
            for k, v in data.items():
                self._walk(v, step, str(k))
        elif isinstance(data, list):
            for v in data:
                self._walk(v, step, key)
        elif key is not None and isinstance(data, (str, int, float, bool)):
            self.by_key.setdefault(key, {})[data] = step

    def candidates(self, argument: str, description: str, since: int | None = None) -> list[Any]:
        """Values for `argument`: same-named JSON fields first, else tokens shaped like the doc's example."""
        keyed = self.by_key.get(argument, {})
        recent = [v for v, s in keyed.items() if since is None or s >= since]
        if recent:
            return recent
        examples = examples_in(description)
        shapes = shapes_in(description)
        shaped = [t for t, s in self.tokens.items() if shape(t) in shapes and (since is None or s >= since)]
        if shaped:
            return shaped
        if since is not None:
            return []
        return examples or list(self.tokens)


def known_values(pool: ValuePool, argument: str, schema: dict[str, Any], limit: int = 24) -> list[Any]:
    """Values of the pool that fit one argument (its JSON type; same-named fields first, else tokens shaped
    like the doc's example), the most recently seen first, at most `limit` (keeps a grammar small)."""
    kind = schema.get("type", "string")
    wanted = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,)}.get(kind)
    if wanted is None:
        return []  # arrays and objects: no enum of scalars fits them
    seen = pool.by_key.get(argument, {})
    if not seen:
        shapes = shapes_in(str(schema.get("description", "")))
        seen = {t: s for t, s in pool.tokens.items() if shape(t) in shapes}
    values = [v for v, _ in sorted(seen.items(), key=lambda item: -item[1])
              if isinstance(v, wanted) and (kind == "boolean" or not isinstance(v, bool))]
    if "enum" in schema:
        values = [v for v in values if v in schema["enum"]]
    return values[:limit]
