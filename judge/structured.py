"""The judge's JSON answer: a schema with one key per step, its token budget, and a parser that also reads a
cut-off answer.

The schema names every step (`step_0` … `step_{K-1}`, in order), so a constrained decoder can neither skip
nor invent steps. The output budget grows with K: it is the answer's worst-case length under the grammar
(`answer_tokens`), so a constrained answer is never cut. The analysis may hold printable ASCII except `"`
and `\\` (`ANALYSIS_PATTERN`): nothing in the answer needs an escape, so the answer's longest text is
known exactly, and a token (at least one byte under a byte-level tokenizer such as SmolLM2's) covers at
least one of its characters. When K steps with full analyses would pass the cap, every analysis is
shortened instead (`analysis_chars`), down to judgments only.
"""

from __future__ import annotations

import json
import re
from typing import Any

from judge.parsing import Label, ParsedOutput
from judge.schemas import MAX_REASON_CHARS

# Printable ASCII without `"` and `\`: the analysis never needs an escape (one character, one byte).
ANALYSIS_PATTERN = r"^[ !#-\[\]-~]*$"
# Below this an analysis says nothing: the answer drops the field (judgments only).
MIN_ANALYSIS_CHARS = 20
# `json.dumps` with these separators writes what the grammar allows (`engine.grammar.JSON_LAYOUT`).
_SEPARATORS = (", ", ": ")
# What an analysis adds to its step's object besides its text: `"analysis": "", `.
_ANALYSIS_OVERHEAD = len('"analysis": "", ')

# One step's object, also when the answer was cut after it (the JSON as a whole then does not load).
_STEP_OBJECT = re.compile(
    r'"step_(\d+)"\s*:\s*\{\s*(?:"analysis"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*)?"judgment"\s*:\s*"(GOOD|BAD)"')


def worst_case_answer(steps: int, chars: int) -> str:
    """The longest answer the schema of `label_schema(steps, chars)` allows: every analysis full, every judgment
    GOOD."""
    entry: dict[str, str] = {"analysis": "x" * chars} if chars else {}
    entry["judgment"] = "GOOD"
    return json.dumps({f"step_{i}": entry for i in range(steps)}, separators=_SEPARATORS)


def answer_tokens(steps: int, chars: int) -> int:
    """Tokens that answer can take at most: one per character, plus the end-of-sequence token."""
    return len(worst_case_answer(steps, chars)) + 1


def analysis_chars(steps: int, cap: int, longest: int) -> int:
    """Longest analysis per step, at most `longest`, with which the worst-case answer for `steps` steps fits
    `cap` tokens; 0 (judgments only) when fewer than `MIN_ANALYSIS_CHARS` would fit."""
    if longest < MIN_ANALYSIS_CHARS:
        return 0
    room = (cap - answer_tokens(steps, 0)) // max(steps, 1) - _ANALYSIS_OVERHEAD
    chars = min(room, longest)
    return chars if chars >= MIN_ANALYSIS_CHARS else 0


def label_schema(steps: int, chars: int) -> dict[str, Any]:
    """One key per step, each `{"analysis": <at most chars>, "judgment": "GOOD" | "BAD"}` (no analysis: chars 0)."""
    step: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
    if chars:
        # The analysis comes first, so the judgment is conditioned on it (AgentEvolver's order).
        step["properties"]["analysis"] = {"type": "string", "minLength": 1, "maxLength": chars,
                                          "pattern": ANALYSIS_PATTERN}
    step["properties"]["judgment"] = {"type": "string", "enum": ["GOOD", "BAD"]}
    step["required"] = list(step["properties"])
    names = [f"step_{i}" for i in range(steps)]
    return {"type": "object", "properties": {name: step for name in names}, "required": names,
            "additionalProperties": False}


def output_instructions(steps: int, chars: int) -> str:
    analysis = (f'"analysis": "<at most {chars} characters, quoting the step as evidence, without double quotes '
                f'or backslashes>", ') if chars else ""
    return (f'Reply with one JSON object with the keys "step_0" to "step_{steps - 1}", in order, each '
            f'{{{analysis}"judgment": "GOOD" or "BAD"}}, and nothing else.')


def parse_json_judgments(text: str) -> ParsedOutput:
    """Labels and analyses from a JSON answer, whole or cut off by the token limit."""
    out = ParsedOutput()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        for key, value in data.items():
            match = re.fullmatch(r"step_(\d+)", key)
            if not match or not isinstance(value, dict):
                continue
            label = str(value.get("judgment", "")).upper()
            if label in ("GOOD", "BAD"):
                _add(out, int(match.group(1)), label, str(value.get("analysis") or ""))  # type: ignore[arg-type]
        return out
    for match in _STEP_OBJECT.finditer(text):
        try:
            reason = json.loads(f'"{match.group(2)}"') if match.group(2) else ""
        except ValueError:
            reason = match.group(2)
        _add(out, int(match.group(1)), match.group(3), reason)  # type: ignore[arg-type]
    return out


def _add(out: ParsedOutput, step: int, label: Label, reason: str) -> None:
    if step in out.labels:
        out.duplicates.append(step)
        return
    out.labels[step] = label
    if reason.strip():
        out.reasons[step] = reason.strip()[:MAX_REASON_CHARS]
