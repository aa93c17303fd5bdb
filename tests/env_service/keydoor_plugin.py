"""A gymnasium env that describes itself: importing this module registers `EvolverTest/KeyDoor-v0`.

Its `description` is the game; its `instruction()` is each seeded task's own goal (which of three
doors the key opens), so the `gym` environment shows it instead of a generic "Reach the goal.".
"""

from __future__ import annotations

from typing import Any

import gymnasium
from gymnasium import spaces

ENV_ID = "EvolverTest/KeyDoor-v0"
DOORS = ("red", "green", "blue")


class KeyDoor(gymnasium.Env):
    metadata: dict[str, Any] = {"render_modes": []}
    description = "A room with a key and three doors; the key opens exactly one of them."

    def __init__(self) -> None:
        self.observation_space = spaces.Discrete(2)  # 0: no key yet, 1: holding the key
        self.action_space = spaces.Discrete(1 + len(DOORS))
        self.door = 0
        self.holding = 0

    def get_action_meanings(self) -> list[str]:
        return ["take", *DOORS]

    def instruction(self) -> str:
        return f"Take the key, then open the {DOORS[self.door]} door."

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[int, dict]:
        super().reset(seed=seed)
        self.door, self.holding = int(self.np_random.integers(len(DOORS))), 0
        return self.holding, {}

    def step(self, action: int) -> tuple[int, float, bool, bool, dict]:
        if action == 0:
            self.holding = 1
            return self.holding, 0.0, False, False, {}
        opened = bool(self.holding) and action - 1 == self.door
        return self.holding, float(opened), opened, False, {}


if ENV_ID not in gymnasium.registry:
    gymnasium.register(ENV_ID, entry_point=KeyDoor, max_episode_steps=6)
