"""BabyAI levels (`minigrid`) as text conversations: the mission, then the view in words each turn."""

from __future__ import annotations

from typing import Any

from common.schemas import Split
from env_service.environments.babyai.text import ACTIONS, PHRASES, describe_view
from env_service.environments.textgames import Parsed, SuiteEnvironment, TextGameInstance, Turn, match_choice
from env_service.environments.textgames.packages import quietly


class BabyAIInstance(TextGameInstance):
    def __init__(self, gymnasium: Any, env_id: str, seed: int, query: str | None, max_turns: int) -> None:
        super().__init__(env_id, seed, query, max_turns)
        self.gymnasium = gymnasium
        self.env: Any = None
        self.mission = ""
        self.last_reward = 0.0
        self.terminated = False
        self.view = ""

    def start(self) -> tuple[str, str]:
        if self.env is None:
            self.env = quietly(lambda: self.gymnasium.make(self.env_id))
        observation, _ = self.env.reset(seed=self.seed)
        self.mission, self.last_reward, self.terminated = str(observation["mission"]), 0.0, False
        self.view = describe_view(observation["image"], self.env.unwrapped.carrying)
        system = ("You are an agent in a grid world of rooms. You see 3 cells to each side and 6 ahead. "
                  f"Actions: {', '.join(ACTIONS)}. 'toggle' opens the door in front of you. "
                  "Each turn, reply with one action, e.g. 'Action: go forward'.")
        return system, f"Mission: {self.mission}.\n{self.view}"

    def parse(self, text: str) -> Parsed[int]:
        return match_choice(text, PHRASES)

    def apply(self, action: int) -> Turn:
        observation, reward, terminated, truncated, _ = self.env.step(action)
        self.last_reward, self.terminated = float(reward), bool(terminated)
        self.view = describe_view(observation["image"], self.env.unwrapped.carrying)
        return Turn(f"You {ACTIONS[action]}. {self.view}", self.last_reward, bool(terminated or truncated),
                    info={"action_name": ACTIONS[action]})

    def success(self) -> bool:
        return self.terminated and self.last_reward > 0

    def invalid_hint(self) -> str:
        return f"Invalid action. Reply with one of: {', '.join(ACTIONS)}, e.g. 'Action: go forward'."

    def snapshot(self) -> dict[str, Any]:
        base = self.env.unwrapped
        carrying = base.carrying
        return {"position": [int(v) for v in base.agent_pos], "direction": int(base.agent_dir),
                "carrying": None if carrying is None else f"{carrying.color} {carrying.type}",
                "terminated": self.terminated}

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None


class BabyAIEnvironment(SuiteEnvironment):
    name = "babyai"
    module = "minigrid"
    distribution = "minigrid"
    default_envs = ("BabyAI-GoToRedBallNoDists-v0", "BabyAI-GoToObj-v0")
    default_max_turns = 20
    background = "BabyAI grid-world missions (minigrid) described in words."

    def check_env_id(self, env_id: str) -> str:
        import gymnasium

        if not env_id.startswith(("BabyAI-", "MiniGrid-")) or env_id not in gymnasium.registry:
            known = sorted(k for k in gymnasium.registry if k.startswith("BabyAI-"))
            raise ValueError(f"babyai.envs: {env_id!r} is not a registered BabyAI/MiniGrid id; known ones include "
                             f"{', '.join(known[:8])} ... ({len(known)} BabyAI levels)")
        return env_id

    def profile(self) -> dict[str, Any]:
        profile = super().profile()
        for entity in profile["entities"]:  # one fixed action vocabulary: the self-questioning prompt can name it
            entity["opts"] = [{"name": a, "description": f"minigrid action {i}"} for i, a in enumerate(ACTIONS)]
        return profile

    def instance(self, env_id: str, split: Split, seed: int, query: str | None) -> BabyAIInstance:
        import gymnasium

        return BabyAIInstance(gymnasium, env_id, seed, query, self.max_turns)
