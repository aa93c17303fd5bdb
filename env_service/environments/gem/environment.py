"""GEM environments as text conversations.

GEM reads a move out of `\\boxed{...}`; a reply without one is wrapped for the model (a mapped
action), because small models rarely write the wrapper. Only the `game:` and `rg:` families are
offered: the math/code/qa ids load Hugging Face datasets, which cannot be fetched offline.
"""

from __future__ import annotations

import re
from typing import Any

from common.schemas import Split
from env_service.environments.textgames import (
    Parsed,
    SuiteEnvironment,
    TextGameInstance,
    Turn,
    extract_wrapped,
)
from env_service.environments.textgames.packages import quietly

OFFLINE_FAMILIES = ("game:", "rg:")
_BOXED = re.compile(r"\\boxed\{[^{}]*\}")
# GEM's own verdict on a move it cannot read ("your submitted action is not valid", "did not provide a valid action")
_REJECTED = re.compile(r"not valid|did not provide a valid|invalid action", re.IGNORECASE)


class GemInstance(TextGameInstance):
    def __init__(self, lib: Any, env_id: str, seed: int, query: str | None, max_turns: int) -> None:
        super().__init__(env_id, seed, query, max_turns)
        self.lib = lib
        self.env: Any = None
        self.last_reward = 0.0
        self.terminated = False
        self.board = ""

    def start(self) -> tuple[str, str]:
        if self.env is None:
            self.env = quietly(lambda: self.lib.make(self.env_id))
        observation, info = self.env.reset(seed=self.seed)
        self.last_reward, self.terminated = 0.0, False
        self.board = f"{observation}\n{info.get('suffix', '')}".strip()
        system = (f"You are playing the GEM game {self.env_id}. Each turn, think briefly, then give your move "
                  "wrapped in \\boxed{}, for example \\boxed{up}.")
        return system, self.board

    def parse(self, text: str) -> Parsed[str]:
        return extract_wrapped(text, _BOXED, lambda move: f"\\boxed{{{move}}}")

    def apply(self, action: str) -> Turn:
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.last_reward = float(reward)
        self.terminated = bool(terminated)
        self.board = f"{observation}\n{info.get('suffix', '')}".strip()
        rejected = self.last_reward < 0 and bool(_REJECTED.search(str(observation)))
        return Turn(self.board, self.last_reward, bool(terminated or truncated), invalid=rejected,
                    info={"terminated": self.terminated, "truncated": bool(truncated)})

    def success(self) -> bool:
        return self.terminated and self.last_reward > 0

    def invalid_hint(self) -> str:
        return "Invalid action: your reply was empty. Give your move wrapped in \\boxed{}, e.g. \\boxed{up}."

    def snapshot(self) -> dict[str, Any]:
        # The text board is the game state GEM exposes; equal boards are equal states for GiGPO.
        return {"board": self.board, "terminated": self.terminated}

    def close(self) -> None:
        self.env = None


class GemEnvironment(SuiteEnvironment):
    name = "gem"
    module = "gem"
    distribution = "gem-llm"
    default_envs = ("game:GuessTheNumber-v0-easy", "game:Sokoban-v0-easy")
    background = "GEM procedurally generated text games; moves are written inside \\boxed{}."

    def check_env_id(self, env_id: str) -> str:
        registry = self.lib.envs.registration.ENV_REGISTRY
        if env_id not in registry or not env_id.startswith(OFFLINE_FAMILIES):
            offline = sorted(k for k in registry if k.startswith(OFFLINE_FAMILIES))
            raise ValueError(f"gem.envs: {env_id!r} is not an offline GEM environment id; known ones include "
                             f"{', '.join(offline[:8])} ... ({len(offline)} in all, families {OFFLINE_FAMILIES})")
        return env_id

    def instance(self, env_id: str, split: Split, seed: int, query: str | None) -> GemInstance:
        return GemInstance(self.lib, env_id, seed, query, self.max_turns)
