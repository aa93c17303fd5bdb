"""The environment service: Gym-style sandboxes over HTTP (/v1 and AgentEvolver-compatible routes)."""
