"""`textarena`: TextArena's single-player games, any id selected in the YAML."""

from env_service.environments.arena.environment import TextArenaEnvironment

__all__ = ["TextArenaEnvironment"]
