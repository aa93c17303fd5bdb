"""Gymnasium toy-text games as text: what the agent reads and how its reply becomes an action."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_HIGHLIGHT = re.compile(r"\x1b\[(?:4\d|10\d)(?:;\d+)*m(.*?)\x1b\[0m", re.DOTALL)  # background colour: the agent
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ACTION_MARK = re.compile(r"action\s*[:=]", re.IGNORECASE)
_WORD = re.compile(r"[a-z]+|\d+")
_PHRASES = (("pick up", "pickup"), ("drop off", "dropoff"))


@dataclass(frozen=True)
class GameText:
    """How one gymnasium game is described to an agent."""

    description: str
    actions: tuple[str, ...]  # index = gymnasium action number
    synonyms: dict[str, str] = field(default_factory=dict)
    legend: str = ""
    success: str = "positive_reward"  # or "terminated": how an ended episode counts as solved


GAMES: dict[str, GameText] = {
    "FrozenLake-v1": GameText(
        "Cross a frozen lake from the start S to the goal G without falling into a hole H. "
        "The ice may be slippery: you do not always move where you intend.",
        ("left", "down", "right", "up"),
        {"west": "left", "south": "down", "east": "right", "north": "up"},
        "@ is you; S start, F frozen (safe), H hole, G goal."),
    "Taxi-v4": GameText(
        "Drive the taxi to the passenger, pick them up, drive to the destination and drop them off. "
        "Walls | block east/west moves.",
        ("south", "north", "east", "west", "pickup", "dropoff"),
        {"down": "south", "up": "north", "right": "east", "left": "west"},
        "@ is the taxi; R, G, Y, B are the pick-up/drop-off locations."),
    "CliffWalking-v1": GameText(
        "Walk from the start (bottom left) to the target T (bottom right) without stepping off the cliff C; "
        "falling sends you back to the start with a large penalty.",
        ("up", "right", "down", "left"),
        {"north": "up", "east": "right", "south": "down", "west": "left"},
        "x is you; o open ground, C cliff, T target.", success="terminated"),
}


def generic_game(n_actions: int, names: list[str] | None = None, description: str = "A gymnasium environment.",
                 success: str = "positive_reward") -> GameText:
    return GameText(description, tuple(names) if names else tuple(str(i) for i in range(n_actions)),
                    success=success)


def render_text(ansi: str | None) -> str:
    """ANSI render output as plain text: highlighted cells become @, colours are dropped."""
    if not ansi:
        return ""
    text = _HIGHLIGHT.sub(lambda m: "@" * max(1, len(m.group(1))), ansi)
    return _ANSI.sub("", text).strip("\n")


def describe_taxi(env: Any, observation: int) -> str:
    row, col, passenger, destination = env.unwrapped.decode(observation)
    names = "RGYB"
    where = "in the taxi" if passenger == 4 else f"waiting at {names[passenger]}"
    return f"Taxi at row {row}, column {col}. Passenger {where}. Destination: {names[destination]}."


class ActionParseFailure(ValueError):
    pass


def parse_action(text: str, game: GameText) -> int:
    """The action the reply names: its last action word or number (after 'Action:' when present)."""
    marks = list(_ACTION_MARK.finditer(text))
    tail = text[marks[-1].end():] if marks else text
    lowered = tail.lower()
    for phrase, word in _PHRASES:
        lowered = lowered.replace(phrase, word)
    index = {name: i for i, name in enumerate(game.actions)}
    index.update({alias: index[target] for alias, target in game.synonyms.items() if target in index})
    chosen: int | None = None
    for token in _WORD.findall(lowered):
        if token in index:
            chosen = index[token]
        elif token.isdigit() and int(token) < len(game.actions):
            chosen = int(token)
        if chosen is not None and marks:
            break  # after an explicit 'Action:', the first action word is the answer
    if chosen is None:
        raise ActionParseFailure(
            "Invalid action. Reply with exactly one of: "
            + ", ".join(f"{name} ({i})" for i, name in enumerate(game.actions))
            + ", e.g. 'Action: " + game.actions[0] + "'.")
    return chosen


def is_exact_action(text: str, game: GameText) -> bool:
    """Whether the reply is just an action (its name or number, optionally after 'Action:'); any other
    reply that parse_action reads is a mapped action, reported apart from success."""
    marks = list(_ACTION_MARK.finditer(text))
    tail = (text[marks[-1].end():] if marks else text).strip().strip("`'\".").lower()
    return tail in game.actions or (tail.isdigit() and int(tail) < len(game.actions))
