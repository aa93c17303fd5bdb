"""The reference rule labeller: GOOD/BAD per step from a synthetic task's verified reference, no LLM.

- a step with tool calls is GOOD when each of its calls is a reference call not yet made in the episode
  (same tool, same arguments); a call outside the reference, or one made before, makes it BAD;
- a reply (a step without calls) is GOOD when it states the reference answer and no other value of its sort
  (`common.answers.answer_alone`) AND an earlier observation of the episode showed that value, so a right
  guess made without looking is BAD; for a task without an answer (a state change), a reply is GOOD once
  every reference call has been made;
- an empty step, or one whose tool call does not parse, is BAD.

Reasons never quote the reference: they go back to the trainer.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from common.actions import ActionParseError, parse_text_actions
from common.answers import answer_alone, answer_stated
from common.schemas import StepLabel
from judge.schemas import JudgeStep

# `judge.client.render_action` writes an OpenAI tool call as `[tool call] name({json arguments})`.
_RENDERED_PREFIX = "[tool call] "
_RENDERED_CALL = re.compile(r"^\[tool call\] ([\w.-]+)\((.*)\)\s*$")


@dataclass(frozen=True)
class Reference:
    """What the rule needs of a verified reference: its calls (canonical keys, in order) and its answer."""

    calls: tuple[str, ...]
    answer: str | None = None


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def call_key(name: str, arguments: dict[str, Any]) -> str:
    """One call as a comparable key: 412 and 412.0 are the same argument, key order does not matter."""
    return json.dumps([name, _canonical(arguments)], sort_keys=True, default=str)


def step_calls(action: str) -> list[str] | None:
    """The calls an action makes, as keys; [] for a reply without calls, None when a call does not parse."""
    rendered = [line for line in action.splitlines() if line.startswith(_RENDERED_PREFIX)]
    if rendered:  # structured tool calls: the message's text beside them is not read (as the environments do)
        keys = []
        for line in rendered:
            match = _RENDERED_CALL.match(line)
            try:
                arguments = json.loads(match.group(2) or "{}") if match else None
            except json.JSONDecodeError:
                return None
            if match is None or not isinstance(arguments, dict):
                return None
            keys.append(call_key(match.group(1), arguments))
        return keys
    try:
        calls = parse_text_actions(action)
    except ActionParseError:
        return None
    if any(call.positional for call in calls):
        return None  # unnamed arguments cannot be matched against the reference's named ones
    return [call_key(call.name, call.arguments) for call in calls]


def label_steps(steps: list[JudgeStep], reference: Reference) -> list[StepLabel]:
    wanted = set(reference.calls)
    made: set[str] = set()
    labels: list[StepLabel] = []
    for t, step in enumerate(steps):
        label, reason = _judge_step(step, steps[:t], wanted, made, reference)
        labels.append(StepLabel(step=t, label=label, reason=reason))
    return labels


def _judge_step(step: JudgeStep, earlier: list[JudgeStep], wanted: set[str], made: set[str],
                reference: Reference) -> tuple[str, str]:
    text = step.action.strip()
    if not text:
        return "BAD", "rule: an empty step"
    keys = step_calls(text)
    if keys is None:
        return "BAD", "rule: a tool call that does not parse"
    if keys:
        new = [k for k in keys if k in wanted and k not in made]
        repeated = any(k in made for k in keys) or len(set(keys)) < len(keys)
        outside = any(k not in wanted for k in keys)
        made.update(keys)
        if outside:
            return "BAD", "rule: a call that is not in the reference"
        if repeated or not new:
            return "BAD", "rule: repeats a call already made"
        return "GOOD", "rule: makes a reference call not made before"
    if reference.answer is None:
        if wanted <= made:
            return "GOOD", "rule: closes after every reference call was made"
        return "BAD", "rule: closes before every reference call was made"
    if not answer_alone(text, reference.answer):
        return "BAD", "rule: the reply does not state the reference answer alone"
    if not any(s.observation and answer_stated(s.observation, reference.answer) for s in earlier):
        return "BAD", "rule: states the reference answer, but no earlier observation showed it (a guess)"
    return "GOOD", "rule: states the reference answer alone, as an earlier observation showed it"
