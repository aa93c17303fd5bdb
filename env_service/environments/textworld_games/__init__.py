"""`textworld`: TextWorld games generated offline by its own generator, one game per seed."""

from env_service.environments.textworld_games.environment import TextWorldEnvironment

__all__ = ["TextWorldEnvironment"]
