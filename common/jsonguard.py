"""What a JSON request body may hold, checked once for every service before any handler runs.

Python's json parser accepts values the rest of the stack cannot carry: integers beyond 64 bits
(orjson refuses to write them back, numpy and torch overflow), lone UTF-16 surrogates (no UTF-8
encoding exists, so tokenizers, hashes and responses fail), NaN/Infinity (not JSON at all) and
nesting deep enough to exhaust the recursion limit. Each handler used to fail on its own way
(500s); here such a body gets one 422 naming the field.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

# orjson writes integers in [-2**63, 2**64 - 1]; anything outside cannot be echoed or stored.
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
DEFAULT_MAX_DEPTH = 64

# Cheap triggers for the full check, as substring scans (Python's `re` would cost ~0.1 us a byte):
# a \uD800-\uDFFF escape, a run of 19+ digits, the non-JSON constants, a 3-digit exponent. Bodies
# without any of them (nearly all) skip the second parse.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# digits -> "0", e/E -> "e", +/- -> "+", anything else -> " ": numbers' shapes become plain substrings.
_SHAPES = bytes(ord("0") if chr(b).isdigit() and b < 128 else ord("e") if b in b"eE"
                else ord("+") if b in b"+-" else ord(" ") for b in range(256))


def is_json_content(content_type: bytes | None) -> bool:
    """Whether FastAPI would parse this body as JSON (no content type counts, as in FastAPI)."""
    if not content_type:
        return True
    mime = content_type.split(b";", 1)[0].strip().lower()
    if not mime.startswith(b"application/"):
        return False
    subtype = mime[len(b"application/"):]
    return subtype == b"json" or subtype.endswith(b"+json")


def find_unrepresentable(body: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> tuple[str, str] | None:
    """(field path, what is wrong) for the first value the services cannot carry, else None.

    A body that is not JSON at all returns None: FastAPI's own parser answers that one.
    """
    if not body:
        return None
    if not _suspect(body) and body.count(b"[") + body.count(b"{") <= max_depth:
        return None
    try:
        value = json.loads(body)
    except RecursionError:
        return "body", f"nesting deeper than {max_depth} levels"
    except ValueError:
        return None
    return _walk(value, max_depth)


def _suspect(body: bytes) -> bool:
    if b"\\u" in body and _SURROGATE_ESCAPE.search(body):
        return True
    if b"NaN" in body or b"Infinity" in body:
        return True
    shapes = body.translate(_SHAPES)
    return b"0" * 19 in shapes or b"e000" in shapes or b"e+000" in shapes


def _walk(root: Any, max_depth: int) -> tuple[str, str] | None:
    stack: list[tuple[Any, tuple[Any, ...]]] = [(root, ("body",))]
    while stack:
        value, path = stack.pop()
        where = ".".join(map(str, path))
        if isinstance(value, dict):
            if len(path) > max_depth:
                return where, f"nesting deeper than {max_depth} levels"
            for key, item in value.items():
                if _bad_text(key):
                    return where, f"a key holds a lone UTF-16 surrogate ({key!a})"
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            if len(path) > max_depth:
                return where, f"nesting deeper than {max_depth} levels"
            stack.extend((item, (*path, i)) for i, item in enumerate(value))
        elif isinstance(value, str):
            if _bad_text(value):
                return where, "text holds a lone UTF-16 surrogate (\\ud800-\\udfff unpaired); send valid Unicode"
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int):
            if not INT_MIN <= value <= INT_MAX:
                return where, f"integer outside the 64-bit range [{INT_MIN}, {INT_MAX}]"
        elif isinstance(value, float) and not math.isfinite(value):
            return where, f"{value} is not a JSON number; send a finite number"
    return None


def _bad_text(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def unsendable(value: Any, root: str) -> tuple[str, str] | None:
    """(field path, why) for the first part of a Python value the services cannot answer as JSON, else None.

    What a response may hold: what orjson writes (numpy arrays and scalars included), with str keys."""
    try:
        orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
        return None
    except TypeError as exc:
        whole = str(exc)
    stack: list[tuple[Any, str]] = [(value, root)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return where, f"a {type(key).__name__} key ({key!r}); JSON keys are text"
                stack.append((child, f"{where}.{key}"))
        elif isinstance(item, (list, tuple)):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
        else:
            try:
                orjson.dumps(item, option=orjson.OPT_SERIALIZE_NUMPY)
            except TypeError as exc:
                return where, f"a {type(item).__name__} ({exc})"
    return root, whole
