"""A gymnasium environment that is not built in: importing this module registers it.

Listed under `env_service.plugins` (import-only), it lets the `gym` environment serve
`EvolverTest/Corridor-v0` by YAML alone. It has no ANSI render, so its observation (the
position) is what the agent reads, and its actions are named by `get_action_meanings()`.
"""

from __future__ import annotations

from typing import Any

import gymnasium
from gymnasium import spaces

ENV_ID = "EvolverTest/Corridor-v0"
LENGTH = 4


class Corridor(gymnasium.Env):
    """Walk from cell 0 to cell LENGTH-1; reward 1 on arrival."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = spaces.Discrete(LENGTH)
        self.action_space = spaces.Discrete(2)
        self.position = 0

    def get_action_meanings(self) -> list[str]:
        return ["back", "onward"]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[int, dict]:
        super().reset(seed=seed)
        self.position = 0
        return self.position, {}

    def step(self, action: int) -> tuple[int, float, bool, bool, dict]:
        self.position = min(max(self.position + (1 if action == 1 else -1), 0), LENGTH - 1)
        arrived = self.position == LENGTH - 1
        return self.position, float(arrived), arrived, False, {}


if ENV_ID not in gymnasium.registry:
    gymnasium.register(ENV_ID, entry_point=Corridor, max_episode_steps=20)
