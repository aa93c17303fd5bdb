"""Running calls on bfcl-eval's backends exactly as its checker does, without leaking its caches.

bfcl-eval's executor (`execute_multi_turn_func_call`) keeps every backend object in the module
globals of `multi_turn_utils`, keyed by `<model_name>_<task_id>_<class>_instance`, and continues
from that object on the next call with the same key. So each episode gets its own model name
(its objects are then its own), and we delete exactly the keys we caused on close and after each
checker run: with 1,000 live instances a scan of those globals would be the slow part.
"""

from __future__ import annotations

import datetime
import inspect
import re
import threading
import uuid
from collections.abc import Iterable
from typing import Any

from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

from .data import BfclTask

_counter_lock = threading.Lock()
_counter = 0


def unique_model_name() -> str:
    """A model name no other episode in this process (or any other) uses."""
    global _counter
    with _counter_lock:
        _counter += 1
        return f"evolver_{uuid.uuid4().hex[:12]}_{_counter}"


def _cache_key(model_name: str, task: BfclTask, class_name: str) -> str:
    # Must match the key bfcl-eval builds in execute_multi_turn_func_call.
    return re.sub(r"[-./:]", "_", f"{model_name}_{task.task_id}_{class_name}_instance")


def _forget(model_names: Iterable[str], task: BfclTask) -> None:
    cache = vars(multi_turn_utils)
    for model_name in model_names:
        for class_name in task.involved_classes:
            cache.pop(_cache_key(model_name, task, class_name), None)


def live_cache_entries() -> int:
    """How many backend objects bfcl-eval currently caches (a leak check for tests)."""
    return sum(1 for key in list(vars(multi_turn_utils)) if key.endswith("_instance"))


class EpisodeBackend:
    """The backend objects of one episode, driven through bfcl-eval's own executor."""

    def __init__(self, task: BfclTask) -> None:
        self.task = task
        self.model_name = unique_model_name()
        self._closed = False
        # Executing no call builds the objects from the task's initial config.
        _, self.instances = self._execute([])
        # What the executor can dispatch: every public method of the involved objects, held-out
        # miss_func functions included (BFCL hides their docs, not the methods themselves).
        self.callable_names = frozenset(
            name for obj in self.instances.values()
            for name, _ in inspect.getmembers(obj, predicate=inspect.ismethod) if not name.startswith("_"))

    def parameters(self, name: str) -> tuple[str, ...] | None:
        """The parameter names of backend method `name`, in signature order (names positional arguments)."""
        if name not in self.callable_names:
            return None
        method = next(getattr(obj, name) for obj in self.instances.values() if hasattr(obj, name))
        return tuple(inspect.signature(method).parameters)

    def _execute(self, calls: list[str]) -> tuple[list[str], dict[str, Any]]:
        return execute_multi_turn_func_call(calls, self.task.initial_config, self.task.involved_classes,
                                            self.model_name, self.task.task_id,
                                            long_context=self.task.long_context, is_evaL_run=False)

    def execute(self, calls: list[str]) -> list[str]:
        """Run calls (BFCL's string form) in order; each result is a string, errors included."""
        if self._closed:
            raise RuntimeError("this episode's backend is closed")
        results, self.instances = self._execute(calls)
        if self._closed:  # closed mid-call (a timed-out step was discarded): the executor may have re-cached
            _forget([self.model_name], self.task)
        return results

    def snapshot(self) -> dict[str, Any]:
        """Public attributes of every stateful backend object: what the checker compares."""
        return {class_name: to_jsonable({k: v for k, v in vars(obj).items() if not k.startswith("_")})
                for class_name, obj in self.instances.items()}

    def close(self) -> None:
        self._closed = True
        _forget([self.model_name], self.task)
        self.instances = {}


def check(task: BfclTask, decoded_turns: list[list[list[str]]]) -> dict[str, Any]:
    """bfcl-eval's multi-turn checker on a finished episode, on fresh backend objects.

    `decoded_turns`: per user turn, per step, the call strings executed in that step.
    Returns the checker's dict (`valid`, and on failure `error_type`, `error_message`, `details`).
    """
    checker_name = unique_model_name()
    try:
        return multi_turn_checker(decoded_turns, task.ground_truth, task.checker_entry(), task.category,
                                  checker_name)
    finally:
        # The checker runs the model's calls as "<name>_eval" and the ground truth as
        # "<name>_ground_truth_eval" (is_evaL_run appends "_eval").
        _forget([f"{checker_name}_eval", f"{checker_name}_ground_truth_eval"], task)


def to_jsonable(value: Any, _ancestors: tuple[int, ...] = ()) -> Any:
    """Plain JSON data for a backend attribute: objects become dicts of their public attributes.

    A reference back to an enclosing object (a directory's `parent`) is dropped, sets become
    sorted lists, and anything else unknown becomes its string form.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if id(value) in _ancestors:
        return None
    inner = (*_ancestors, id(value))
    if isinstance(value, dict):
        return {str(k): to_jsonable(v, inner) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v, inner) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((to_jsonable(v, inner) for v in value), key=repr)
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if hasattr(value, "__dict__"):
        public = {k: v for k, v in vars(value).items() if not k.startswith("_") and id(v) not in inner}
        return {"__class__": type(value).__name__, **{k: to_jsonable(v, inner) for k, v in public.items()}}
    return str(value)
