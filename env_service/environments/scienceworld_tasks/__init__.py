"""`scienceworld`: ScienceWorld's 30 science tasks (the simulator ships in its wheel; needs Java 17)."""

from env_service.environments.scienceworld_tasks.environment import ScienceWorldEnvironment

__all__ = ["ScienceWorldEnvironment"]
