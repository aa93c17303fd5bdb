"""Test-only fault injection: kill the process with SIGKILL at a named point of a mutation.

Off unless EXPERIENCE_MANAGER_FAULT is set, as `<op>:<point>[:<n>]`, for example
`summarize:after_upsert:2` (die once at least 2 points of a summarize batch are in Qdrant).
Points: after_intent, after_upsert, before_commit, after_commit. The mechanism is `common.faults`.
"""

from __future__ import annotations

from common import faults

FAULT_ENV = "EXPERIENCE_MANAGER_FAULT"


class FaultInjector(faults.FaultInjector):
    def __init__(self, spec: str | None = None) -> None:
        super().__init__(FAULT_ENV, spec)
