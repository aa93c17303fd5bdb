"""`gym`: gymnasium toy-text games (FrozenLake, Taxi, CliffWalking, ...) as text conversations."""

from env_service.environments.gym.env import GymEnvironment, GymInstance

__all__ = ["GymEnvironment", "GymInstance"]
