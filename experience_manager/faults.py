"""Test-only fault injection: kill the process with SIGKILL at a named point of a mutation.

Off unless EXPERIENCE_MANAGER_FAULT is set, as `<op>:<point>[:<n>]`, for example
`summarize:after_upsert:2` (die once at least 2 points of a summarize batch are in Qdrant).
Points: after_intent, after_upsert, before_commit, after_commit.
"""

from __future__ import annotations

import os
import signal

from loguru import logger

FAULT_ENV = "EXPERIENCE_MANAGER_FAULT"


class FaultInjector:
    def __init__(self, spec: str | None = None) -> None:
        spec = spec if spec is not None else os.environ.get(FAULT_ENV, "")
        parts = spec.split(":") if spec else []
        self.op = parts[0] if parts else None
        self.point = parts[1] if len(parts) > 1 else None
        self.threshold = int(parts[2]) if len(parts) > 2 else 0
        if self.op:
            logger.warning("fault injection armed: {} (test-only; unset {} in production)", spec, FAULT_ENV)

    def check(self, op: str, point: str, count: int = 0) -> None:
        if self.op == op and self.point == point and count >= self.threshold:
            logger.warning("fault injection: SIGKILL at {}:{} (count {})", op, point, count)
            os.kill(os.getpid(), signal.SIGKILL)
