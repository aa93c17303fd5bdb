"""`bfcl`: BFCL v3 multi-turn (800 tasks from the bfcl-eval package), graded by bfcl-eval's checker."""

from .environment import BfclConfig, BfclEnvironment, BfclInstance

__all__ = ["BfclConfig", "BfclEnvironment", "BfclInstance"]
