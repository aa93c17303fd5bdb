"""Synthetic tasks' verified references, fetched from the task manager by `task_id` for the judge.

The trainer never sends or receives a reference: the judge asks the task manager itself and sends back only
labels. A task the task manager has no reference for (an environment's own task: 404 or 409) is remembered as
such; a task manager that cannot be reached is not remembered, so the next batch asks again.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from loguru import logger

from common.http import ServiceCallError
from judge.reference_rule import Reference, call_key, step_calls
from task_manager.client import TaskClient
from task_manager.protocol import ReferenceResponse

NO_REFERENCE = (404, 409)  # unknown here, or an original task: the configured LLM judge labels it


@dataclass(frozen=True)
class FetchedReference:
    rule: Reference  # what the rule labeller compares against
    prompt: str  # what an LLM judge given the reference reads


def from_response(response: ReferenceResponse) -> FetchedReference:
    if response.calls is not None:
        keys = tuple(call_key(c.name, c.arguments) for c in response.calls)
    else:  # only the assistant messages are known: read their calls as a rollout's are read
        keys = tuple(k for action in response.actions for k in (step_calls(action) or []))
    lines = [f"{i + 1}. {action}" for i, action in enumerate(response.actions)]
    if response.answer is not None:
        lines.append(f"Expected final answer: {response.answer}")
    return FetchedReference(Reference(keys, response.answer), "\n".join(lines))


class ReferenceSource:
    def __init__(self, task_manager_url: str, *, cache_size: int = 4096, timeout: float = 30.0) -> None:
        self.client = TaskClient(task_manager_url, timeout=timeout, retries=2)
        self.cache_size = cache_size
        self._cache: OrderedDict[str, FetchedReference | None] = OrderedDict()
        self.failures = 0  # lookups that got no answer (the task manager unreachable or failing)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def get(self, task_id: str) -> FetchedReference | None:
        if task_id in self._cache:
            self._cache.move_to_end(task_id)
            return self._cache[task_id]
        try:
            found: FetchedReference | None = from_response(await self.client.reference(task_id))
        except ServiceCallError as exc:
            if exc.status not in NO_REFERENCE:
                self.failures += 1
                logger.warning("no reference for task {}: the task manager did not answer ({}); judging it "
                               "without one", task_id, exc)
                return None
            found = None
        self._cache[task_id] = found
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return found
