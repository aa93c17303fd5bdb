"""`gem`: GEM's (`gem-llm`) offline procedurally generated environments, any id selected in the YAML."""

from env_service.environments.gem.environment import GemEnvironment

__all__ = ["GemEnvironment"]
