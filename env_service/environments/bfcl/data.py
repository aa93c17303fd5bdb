"""BFCL v3 multi-turn data as shipped in the `bfcl-eval` package: tasks, ground truth, tool docs, splits.

The package names the files `BFCL_v4_multi_turn_*`, but they hold the v3 multi-turn sets: four
categories of 200 tasks each. Everything is read once per process and shared read-only by every
instance (an instance deep-copies what it mutates).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.resources
import json
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any

from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

CATEGORIES: tuple[str, ...] = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                               "multi_turn_long_context")
SHORT_CATEGORY_NAMES = {c.removeprefix("multi_turn_"): c for c in CATEGORIES}
DEFAULT_SPLIT_FRACTIONS: dict[str, float] = {"train": 0.7, "validation": 0.1, "test": 0.2}


@dataclass(frozen=True)
class BfclTask:
    """One multi-turn task: a user message per turn (empty for a miss_func holdout turn)."""

    task_id: str
    category: str
    turns: list[list[dict[str, str]]]
    initial_config: dict[str, Any]
    involved_classes: list[str]
    ground_truth: list[list[str]]
    # turn index -> names of functions BFCL holds out until that turn (miss_func only)
    held_out: dict[int, list[str]] = field(default_factory=dict)

    @property
    def long_context(self) -> bool:
        # The same rule bfcl-eval applies when it executes calls for this category.
        return "long_context" in self.category

    def checker_entry(self) -> dict[str, Any]:
        """The test entry bfcl-eval's multi-turn checker expects."""
        return {"id": self.task_id, "initial_config": self.initial_config,
                "involved_classes": self.involved_classes}


def _data_root() -> Any:
    return importlib.resources.files("bfcl_eval") / "data"


def _jsonl(path: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@lru_cache(maxsize=1)
def all_tasks() -> dict[str, BfclTask]:
    """Every multi-turn task of the four categories, keyed by BFCL's own id, in file order."""
    root = _data_root()
    tasks: dict[str, BfclTask] = {}
    for category in CATEGORIES:
        answers = {row["id"]: row["ground_truth"] for row in _jsonl(root / "possible_answer" / f"BFCL_v4_{category}.json")}
        for row in _jsonl(root / f"BFCL_v4_{category}.json"):
            held_out = {int(turn): list(names) for turn, names in (row.get("missed_function") or {}).items()}
            tasks[row["id"]] = BfclTask(
                task_id=row["id"], category=category, turns=row["question"],
                initial_config=row["initial_config"], involved_classes=list(row["involved_classes"]),
                ground_truth=answers[row["id"]], held_out=held_out)
    return tasks


@cache
def class_function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """BFCL's function docs of one backend class (BFCL's own schema: parameters of type `dict`)."""
    path = _data_root() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    return tuple(_jsonl(path))


def task_function_docs(task: BfclTask) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """(docs available from the start, turn -> docs that become available at that turn).

    Mirrors `bfcl_eval.utils.populate_test_cases_with_predefined_functions`: the docs of every
    involved class, minus miss_func's held-out functions, which come back at their turn.
    """
    docs = [copy.deepcopy(doc) for class_name in task.involved_classes for doc in class_function_docs(class_name)]
    later: dict[int, list[dict[str, Any]]] = {}
    for turn, names in sorted(task.held_out.items()):
        for name in names:
            index = next((i for i, doc in enumerate(docs) if doc["name"] == name), None)
            if index is not None:
                later.setdefault(turn, []).append(docs.pop(index))
    return docs, later


def to_openai_tool(doc: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function doc as an OpenAI tool schema (BFCL's `dict`/`float`/`tuple`/`any` types mapped)."""
    return {"type": "function", "function": {"name": doc["name"], "description": doc.get("description", ""),
                                             "parameters": _openapi_schema(doc.get("parameters", {"type": "dict"}))}}


_OPENAPI_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string", "list": "array",
                  "bool": "boolean"}


def _openapi_schema(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_openapi_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {key: _openapi_schema(value) for key, value in schema.items()}
    if isinstance(schema.get("type"), str):
        converted["type"] = _OPENAPI_TYPES.get(schema["type"], schema["type"])
    if isinstance(schema.get("properties"), dict):  # property names are data, not schema keywords
        converted["properties"] = {name: _openapi_schema(sub) for name, sub in schema["properties"].items()}
    return converted


@lru_cache(maxsize=8)
def _split_table(fraction_items: tuple[tuple[str, float], ...], seed: int) -> dict[str, tuple[str, ...]]:
    fractions = dict(fraction_items)
    by_category: dict[str, list[str]] = {}
    for task in all_tasks().values():
        by_category.setdefault(task.category, []).append(task.task_id)
    table: dict[str, list[str]] = {"train": [], "validation": [], "test": []}
    for ids in by_category.values():
        # A hash order (not file order) so every split mixes early and late tasks of a category.
        ordered = sorted(ids, key=lambda tid: hashlib.sha256(f"{seed}:{tid}".encode()).hexdigest())
        n_train = round(len(ordered) * fractions["train"])
        n_validation = round(len(ordered) * fractions["validation"])
        chosen = {"train": ordered[:n_train], "validation": ordered[n_train:n_train + n_validation],
                  "test": ordered[n_train + n_validation:]}
        for split, members in chosen.items():
            table[split].extend(members)
    order = {tid: i for i, tid in enumerate(all_tasks())}
    return {split: tuple(sorted(ids, key=order.__getitem__)) for split, ids in table.items()}


def split_task_ids(fractions: dict[str, float], seed: int) -> dict[str, tuple[str, ...]]:
    """Task ids per split, each split in BFCL's file order; every category is split by `fractions`."""
    return _split_table(tuple(sorted(fractions.items())), seed)
