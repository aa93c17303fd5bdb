"""The judge's JSON answer: a schema with one key per step, and a parser that also reads a cut-off answer.

The schema names every step (`step_0` … `step_{K-1}`, in order), so a constrained decoder can neither skip
nor invent steps. Each analysis is capped so that K steps fit the output budget: the budget cannot
silently cut a long trajectory's last steps, it shortens every analysis instead.
"""

from __future__ import annotations

import json
import re
from typing import Any

from advantage.judge.parsing import MAX_REASON_CHARS, Label, ParsedOutput

# Tokens one step costs besides its analysis (`"step_12": {"analysis": "", "judgment": "GOOD"}, `),
# and characters per token of English text (conservative: small-model tokenizers split more).
STEP_OVERHEAD_TOKENS = 24
CHARS_PER_TOKEN = 3
MAX_ANALYSIS_CHARS = 200
MIN_ANALYSIS_CHARS = 20

# One step's object, also when the answer was cut after it (the JSON as a whole then does not load).
_STEP_OBJECT = re.compile(
    r'"step_(\d+)"\s*:\s*\{\s*(?:"analysis"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*)?"judgment"\s*:\s*"(GOOD|BAD)"')


def analysis_chars(steps: int, max_tokens: int) -> int:
    """Longest analysis per step that lets all `steps` fit in `max_tokens`; 0 means judgments only."""
    per_step = max_tokens // max(steps, 1) - STEP_OVERHEAD_TOKENS
    chars = min(per_step * CHARS_PER_TOKEN, MAX_ANALYSIS_CHARS)
    return chars if chars >= MIN_ANALYSIS_CHARS else 0


def label_schema(steps: int, max_tokens: int) -> dict[str, Any]:
    chars = analysis_chars(steps, max_tokens)
    step: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
    if chars:
        # The analysis comes first, so the judgment is conditioned on it (AgentEvolver's order).
        step["properties"]["analysis"] = {"type": "string", "minLength": 1, "maxLength": chars}
    step["properties"]["judgment"] = {"type": "string", "enum": ["GOOD", "BAD"]}
    step["required"] = list(step["properties"])
    names = [f"step_{i}" for i in range(steps)]
    return {"type": "object", "properties": {name: step for name in names}, "required": names,
            "additionalProperties": False}


def output_instructions(steps: int, max_tokens: int) -> str:
    chars = analysis_chars(steps, max_tokens)
    analysis = f'"analysis": "<at most {chars} characters, quoting the step as evidence>", ' if chars else ""
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
