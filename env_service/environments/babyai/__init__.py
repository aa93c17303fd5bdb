"""`babyai`: BabyAI levels from `minigrid`, the agent's view described in words, actions as words."""

from env_service.environments.babyai.environment import BabyAIEnvironment

__all__ = ["BabyAIEnvironment"]
