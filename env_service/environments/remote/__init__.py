"""`remote`: forwards every call to another env server speaking /v1 or the AgentEvolver routes."""

from .environment import RemoteConfig, RemoteEnvironment, RemoteInstance

__all__ = ["RemoteConfig", "RemoteEnvironment", "RemoteInstance"]
