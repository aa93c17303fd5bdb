"""`signal`: a two-turn memory task. Turn one reveals a cue; the reward is for acting on it at turn two."""

from .environment import SignalConfig, SignalEnvironment, SignalInstance

__all__ = ["SignalConfig", "SignalEnvironment", "SignalInstance"]
