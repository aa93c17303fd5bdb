"""Grading a text answer (flights tier-1 tasks, and the task manager's synthetic lookups): does the reply
state the right value, and no competing one?

Robust to the ways a small model writes a value: "$412", "412 USD", "412.00", "1,200", "p1003",
"P 1003", "ua123-0603". Dates ("2025-06-03", "June 3", "Aug. 4, 2025") and clock times ("14:05") are not read as amounts, so
restating the question does not count against the answer. A reply that also states a competing value
(another fare of the route, another passenger's id) is wrong: pasting a whole search result is not an
answer.
"""

from __future__ import annotations

import re

_PASSENGER_ID = re.compile(r"(?<![A-Za-z0-9])P\s*-?\s*(\d{4})(?!\d)", re.IGNORECASE)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIME = re.compile(r"\d{1,2}:\d{2}")
_MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December"
           "|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec")
_MONTH_DAY = re.compile(rf"\b(?:{_MONTHS})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,\s*\d{{4}})?", re.IGNORECASE)
_ID_TOKEN = re.compile(r"\b[A-Za-z]+\d[\w-]*")  # flight ids (UA123-0603), passenger ids, order ids
_NUMBER = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\w.])\d+(?:\.\d+)?")


def passenger_ids(text: str) -> set[str]:
    return {f"P{m}" for m in _PASSENGER_ID.findall(text or "")}


def amounts(text: str) -> set[str]:
    """The numbers a reply states, normalized ("1,200.00" -> "1200"); dates, times and ids left out."""
    text = text or ""
    for pattern in (_DATE, _MONTH_DAY, _TIME, _ID_TOKEN):
        text = pattern.sub(" ", text)
    found = set()
    for raw in _NUMBER.findall(text):
        value = float(raw.replace(",", ""))
        found.add(str(int(value)) if value.is_integer() else str(value))
    return found


def identifiers(text: str) -> set[str]:
    """The ids a reply states (flight ids, order ids), upper-cased: "ua123-0603" -> "UA123-0603"."""
    return {m.upper() for m in _ID_TOKEN.findall(text or "")}


def _stated(reply: str, expected: str, wrong: tuple[str, ...] | list[str]) -> tuple[set[str], str, tuple[str, ...]]:
    """The values of the expected value's sort that `reply` states, with `expected` and `wrong` as compared.

    The sort is the expected value's: a passenger id, an amount, or else another id (a flight id)."""
    if _PASSENGER_ID.fullmatch(expected):
        return passenger_ids(reply), expected, tuple(wrong)
    if amounts(expected):
        return amounts(reply), expected, tuple(wrong)
    return identifiers(reply), expected.upper(), tuple(w.upper() for w in wrong)


def answer_correct(reply: str, expected: str, wrong: tuple[str, ...] | list[str] = ()) -> bool:
    """True when `reply` states `expected` and none of `wrong` (values of the same sort)."""
    stated, expected, wrong = _stated(reply, expected, wrong)
    return expected in stated and not stated.intersection(wrong)


def answer_stated(text: str, expected: str) -> bool:
    """`text` states `expected` among the values of its sort, whatever else it states (an observation listing
    several fares states each of them)."""
    stated, expected, _ = _stated(text, expected, ())
    return expected in stated


def answer_alone(reply: str, expected: str) -> bool:
    """Stricter than `answer_correct`: the reply states `expected` and no other value of its sort at all.

    A hedge such as "Hiro has 2, that is 2, 2,500" passes `answer_correct` when no passenger has 2 USD of
    credit; here it fails. Used to re-grade recorded replies (the ablation report's single-value column)."""
    stated, expected, _ = _stated(reply, expected, ())
    return stated == {expected}
