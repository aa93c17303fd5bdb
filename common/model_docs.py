"""Markdown tables of pydantic models, for generated documentation pages: one table per model, its nested models
after it, each key with its type, default and description (`Field(description=...)`, else the trailing comment
on the line that declares it in the class body).

Used by the configuration reference (`evolver_launcher/config_reference.py`) and the environment profile
reference (`task_manager/profile_reference.py`).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import textwrap
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined


def field_comments(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> the trailing comment on its declaration line in the class body (the MRO's too)."""
    comments: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(cls))
        except (OSError, TypeError):
            continue
        lines = source.splitlines()
        for node in ast.parse(source).body[0].body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                line = lines[node.end_lineno - 1]
                match = re.search(r"#\s*(.+)$", line)
                if match and "noqa" not in match.group(1):
                    comments[node.target.id] = match.group(1).strip()
    return comments


def type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(json.dumps(arg) for arg in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in args)
    if origin in (list, tuple, set):
        return f"list[{', '.join(type_name(arg) for arg in args if arg is not Ellipsis)}]"
    if origin is dict:
        return f"dict[{', '.join(type_name(arg) for arg in args)}]"
    if origin is typing.Annotated:
        return type_name(args[0])
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """Settings models an annotation holds, directly or inside a union, list or dict."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found.extend(models_in(arg))
    return found


def default_text(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, BaseModel):
            return "(section)"
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    return f"`{json.dumps(value, default=str)}`"


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def sections(model: type[BaseModel], path: str) -> list[str]:
    """Markdown for `model` at key `path` and, after it, every model nested in it."""
    comments = field_comments(model)
    doc = inspect.getdoc(model) if model.__doc__ else ""
    out = [f"## `{path}`", ""]
    if doc and not doc.startswith(("Usage docs", "A base class")):
        out += [cell(doc.split("\n\n")[0]), ""]
    out += ["| key | type | default | description |", "|---|---|---|---|"]
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        description = field.description or comments.get(name, "")
        out.append(f"| `{name}` | {cell(type_name(field.annotation))} | {cell(default_text(field))} | "
                   f"{cell(description)} |")
        for inner in models_in(field.annotation):
            origin = typing.get_origin(field.annotation)
            key = f"{path}.{name}" + (".<name>" if origin is dict else "[]" if origin is list else "")
            nested.append((key, inner))
    out.append("")
    seen: set[str] = set()
    for key, inner in nested:
        if key in seen:
            continue
        seen.add(key)
        out += sections(inner, key)
    return out
