"""The BabyAI agent's egocentric 7x7 view in words, and the words that name its actions."""

from __future__ import annotations

from typing import Any

import numpy as np

# minigrid's Actions enum order: left, right, forward, pickup, drop, toggle, done
ACTIONS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle", "done")
PHRASES: dict[str, int] = {
    "turn left": 0, "left": 0, "rotate left": 0,
    "turn right": 1, "right": 1, "rotate right": 1,
    "go forward": 2, "forward": 2, "move forward": 2, "walk forward": 2, "go straight": 2, "ahead": 2,
    "pick up": 3, "pickup": 3, "pick": 3, "take": 3, "grab": 3,
    "drop": 4, "put down": 4,
    "toggle": 5, "open": 5, "open door": 5, "unlock": 5,
    "done": 6,
}
_SKIP = {"unseen", "empty", "floor", "wall"}
_DOOR_STATE = {0: "open", 1: "closed", 2: "locked"}


def _count(n: int, word: str) -> str:
    return f"{n} step{'s' if n != 1 else ''} {word}"


def describe_view(image: np.ndarray, carrying: Any = None) -> str:
    """What the agent sees. The view grid is (x, y) with the agent at (3, 6) facing -y (up)."""
    from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT

    width, height = image.shape[0], image.shape[1]
    ax, ay = width // 2, height - 1
    seen: list[str] = []
    for x in range(width):
        for y in range(height):
            kind = IDX_TO_OBJECT.get(int(image[x, y, 0]), "unseen")
            if kind in _SKIP or (x, y) == (ax, ay):
                continue
            name = f"a {IDX_TO_COLOR.get(int(image[x, y, 1]), '')} {kind}"
            if kind == "door":
                name = f"a {_DOOR_STATE.get(int(image[x, y, 2]), '')} {IDX_TO_COLOR.get(int(image[x, y, 1]), '')} door"
            ahead, side = ay - y, x - ax
            where = [_count(ahead, "ahead")] if ahead else []
            if side:
                where.append(_count(abs(side), "to the right" if side > 0 else "to the left"))
            seen.append(f"{name} {' and '.join(where) or 'right here'}")
    front = IDX_TO_OBJECT.get(int(image[ax, ay - 1, 0]), "unseen")
    lines = ["You see " + ("; ".join(seen) if seen else "no objects") + "."]
    if front == "wall":
        lines.append("A wall is right in front of you.")
    elif front not in _SKIP:
        lines.append(f"Right in front of you: a {front}.")
    if carrying is not None:
        lines.append(f"You are carrying a {carrying.color} {carrying.type}.")
    return " ".join(lines)
