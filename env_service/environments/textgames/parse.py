"""Turning what a small model writes into a suite's action.

Two shapes of suite exist: those with a finite list of valid actions at each turn (TextWorld's
admissible commands, BabyAI's seven actions) and those that take a free answer in a wrapper
(GEM's \\boxed{...}, TextArena's [...]). Either way the parse says whether the reply was used as
written (`exact`), rewritten by us (`mapped`), or unusable (`invalid`), so that a success bought by
our mapping is reported as such and cannot pass for the model's skill.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

T = TypeVar("T")
Kind = Literal["exact", "mapped", "invalid"]

# "Action: go north", "Command = take apple", "**Answer:** 42": the text after the last such label wins.
_LABEL = re.compile(r"(?:action|answer|command|move|guess)\**\s*[:=]\s*\**", re.IGNORECASE)
_WORDS = re.compile(r"[a-z0-9]+")
SIMILARITY_CUTOFF = 0.75  # difflib ratio; below it a reply is too far from every action to guess one


@dataclass(frozen=True)
class Parsed(Generic[T]):
    action: T | None
    kind: Kind
    text: str = ""  # the candidate text the action came from (for the agent-readable error)


def normalize(text: str) -> str:
    return " ".join(_WORDS.findall(text.lower()))


def candidate(text: str) -> str:
    """The part of a reply that is meant as the action: after the last label, its first non-empty line."""
    labels = list(_LABEL.finditer(text))
    tail = text[labels[-1].end():] if labels else text
    for line in tail.splitlines():
        line = line.strip().strip("`*\"'").strip()
        if line:
            return line.rstrip(".!")
    return ""


def _contains(text: str, phrase: str) -> bool:
    """Whether normalized `phrase` occurs in normalized `text` as whole words."""
    return re.search(rf"(?<![a-z0-9]){re.escape(phrase)}(?![a-z0-9])", text) is not None


def match_choice(text: str, choices: Mapping[str, T]) -> Parsed[T]:
    """The action among `choices` (phrase -> action) that the reply names.

    exact: the candidate is a phrase. mapped: the candidate (else the whole reply) names exactly one
    action, or the candidate is close to one phrase. invalid: none of these, or a reply that names
    several actions: small models echo the observation with its list of valid commands, and picking
    one of them (the longest, say) would count an echo as a move.
    """
    table = {normalize(phrase): action for phrase, action in choices.items() if normalize(phrase)}
    cand = normalize(candidate(text))
    if cand in table:
        return Parsed(table[cand], "exact", cand)
    for scope in (cand, normalize(text)):
        inside = [p for p in table if _contains(scope, p)]
        # A phrase inside a longer one found too ("open box" in "open red box") is part of it, not a second action.
        named = {table[p] for p in inside if not any(q != p and _contains(q, p) for q in inside)}
        if len(named) > 1:
            return Parsed(None, "invalid", cand)
        if named:
            return Parsed(named.pop(), "mapped", cand)
    close = difflib.get_close_matches(cand, list(table), n=1, cutoff=SIMILARITY_CUTOFF) if cand else []
    if close:
        return Parsed(table[close[0]], "mapped", cand)
    return Parsed(None, "invalid", cand)


def extract_wrapped(text: str, wrapped: re.Pattern[str], wrap: Callable[[str], str]) -> Parsed[str]:
    """For suites that read an answer out of a wrapper: pass a wrapped reply through unchanged,
    otherwise wrap the reply's candidate (its labelled part or first line)."""
    if wrapped.search(text):
        return Parsed(text, "exact", text)
    cand = candidate(text)
    if not cand:
        return Parsed(None, "invalid", cand)
    return Parsed(wrap(cand), "mapped", cand)
