"""Self-questioning: explore environments, synthesize verified tasks, grade them, serve curricula."""
