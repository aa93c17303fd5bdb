"""`reasoning_gym`: reasoning-gym's procedural tasks, graded by their own verifiers."""

from env_service.environments.reasoning.environment import ReasoningGymEnvironment

__all__ = ["ReasoningGymEnvironment"]
