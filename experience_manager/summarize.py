"""Distill experiences from a group of trajectories of one task.

With a summarizer LLM: ReMe's three facets (success, failure, best-versus-worst), strict JSON of 1-3
items each, cheap validation and one retry. Without one, or when it fails: a deterministic "case"
(the task, the outcome, the ordered tool calls, the last error, what successes did that failures did not).
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any

from common.llm import LLMClient, LLMError, json_schema_format
from common.schemas import ExperienceKind
from experience_manager.text import forbidden_markup, lexical_tokens, normalize, scrub_markup, truncate
from experience_manager.trajectories import ToolUse, TrajectoryView, transcript

WHEN_TO_USE_LIMITS = (10, 300)
CONTENT_LIMITS = (20, 1200)
HEURISTIC_QUALITY = 0.3


@dataclass
class Candidate:
    when_to_use: str
    content: str
    kind: ExperienceKind
    quality: float
    author: str
    tags: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    task_ids: list[str] = field(default_factory=list)
    trajectory_ids: list[str] = field(default_factory=list)
    support: int = 1
    demonstration: list[dict[str, Any]] | None = None
    task_kind: str | None = None


# ---------------------------------------------------------------- heuristic cases


def _trace(uses: list[ToolUse], limit: int) -> str:
    shown = " -> ".join(u.render() for u in uses[:limit])
    return shown + (f" -> … ({len(uses) - limit} more)" if len(uses) > limit else "")


def _first_order(uses: list[ToolUse]) -> list[str]:
    seen: list[str] = []
    for use in uses:
        if use.name not in seen:
            seen.append(use.name)
    return seen


def heuristic_case(views: list[TrajectoryView]) -> Candidate:
    """One deterministic case for a task group (ExpRAG style)."""
    query = views[0].query
    successes = sorted((v for v in views if v.success), key=lambda v: (-v.reward, len(v.tool_uses)))
    failures = sorted((v for v in views if not v.success), key=lambda v: v.reward)
    best_reward = max(v.reward for v in views)
    parts = [f"Outcome: {len(successes)} of {len(views)} attempts succeeded (best reward {best_reward:.2f})."]
    if successes:
        best = successes[0]
        if best.tool_uses:
            parts.append(f"What worked ({len(best.tool_uses)} tool calls): {_trace(best.tool_uses, 12)}.")
        elif best.final_answer:
            parts.append(f"What worked: answered directly: {truncate(best.final_answer, 160)}")
    if failures:
        worst = failures[0]
        if worst.tool_uses:
            parts.append(f"A failed attempt: {_trace(worst.tool_uses, 8)}.")
        if worst.last_error:
            error = worst.last_error.rstrip()
            parts.append(f"Last error of a failed attempt: {error}" + ("" if error.endswith((".", "!", "?")) else "."))
    if successes and failures:
        success_tools = [n for v in successes for n in _first_order(v.tool_uses)]
        failure_tools = {n for v in failures for n in _first_order(v.tool_uses)}
        only_success = [n for n in dict.fromkeys(success_tools) if n not in failure_tools]
        only_failure = [n for n in dict.fromkeys(n for v in failures for n in _first_order(v.tool_uses))
                        if n not in set(success_tools)]
        if only_success:
            parts.append(f"Successful runs called {', '.join(only_success)}; failed runs did not.")
        if only_failure:
            parts.append(f"Failed runs called {', '.join(only_failure)}; successful runs did not.")
        best_order, worst_order = _first_order(successes[0].tool_uses), _first_order(failures[0].tool_uses)
        if not only_success and not only_failure and best_order != worst_order and best_order:
            parts.append(f"Successful runs called tools in the order {' -> '.join(best_order)}; "
                         f"failed runs in the order {' -> '.join(worst_order)}.")
    content = truncate(scrub_markup(" ".join(parts)), CONTENT_LIMITS[1])
    tools = list(dict.fromkeys(u.name for v in views for u in v.tool_uses))[:20]
    outcome = "success" if successes and not failures else "failure" if not successes else "mixed"
    return Candidate(
        when_to_use=truncate(query, WHEN_TO_USE_LIMITS[1]), content=content, kind=ExperienceKind.case,
        quality=HEURISTIC_QUALITY, author="heuristic", tags=["case", outcome], tools=tools,
        task_ids=[views[0].task_id], trajectory_ids=[v.trajectory_id for v in views][:10])


# ---------------------------------------------------------------- LLM summarization

_ITEM_SPEC = (
    'Answer with JSON only: a list of 1 to {n} objects, each {{"when_to_use": "<the situation in which this '
    'advice applies, general enough to match similar tasks, at most 300 characters>", "experience": "<the '
    'actionable advice, at most 1200 characters>", "tags": ["<keyword>", ...], "tools_used": ["<tool name>", '
    '...], "confidence": <0..1>}}. Do not restate the task; do not copy ids, dates or file paths of this run.')

SUCCESS_PROMPT = (
    "You distill reusable experience from an AI agent's successful attempt at a task.\n"
    "Task: {query}\nOutcome: success (reward {reward:.2f})\nTrajectory:\n{trajectory}\n\n"
    "Extract the transferable steps and decisions that made it succeed. " + _ITEM_SPEC)
FAILURE_PROMPT = (
    "You distill reusable experience from an AI agent's failed attempt at a task.\n"
    "Task: {query}\nOutcome: failure (reward {reward:.2f})\nTrajectory:\n{trajectory}\n\n"
    "Identify the failure point, its cause, what to do instead and how to prevent it. " + _ITEM_SPEC)
COMPARATIVE_PROMPT = (
    "You compare two attempts of an AI agent at the same task.\nTask: {query}\n"
    "Better attempt (reward {best_reward:.2f}):\n{best}\n\nWorse attempt (reward {worst_reward:.2f}):\n{worst}\n\n"
    "Explain what the better attempt did differently that made the difference. " + _ITEM_SPEC)
MERGE_PROMPT = (
    "Two experiences were distilled for an AI agent.\nA) when_to_use: {a_when}\n   advice: {a_content}\n"
    "B) when_to_use: {b_when}\n   advice: {b_content}\n\n"
    'Do A and B give the same advice for the same situation? Answer with JSON only: {{"same": false}} if not, '
    'otherwise {{"same": true, "when_to_use": "<merged situation>", "experience": "<merged advice keeping every '
    'useful detail of both>"}}.')

_JSON_FENCE_RE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def parse_json(text: str) -> Any:
    """Strict JSON, allowing only a ```json fence around it (models add one even when told not to)."""
    text = text.strip()
    fenced = _JSON_FENCE_RE.fullmatch(text)
    if fenced:
        text = fenced.group(1).strip()
    return json.loads(text)


def _restates_task(content: str, query: str) -> bool:
    content_tokens, query_tokens = set(lexical_tokens(content)), set(lexical_tokens(query))
    if not content_tokens:
        return True
    if normalize(content).lower() in normalize(query).lower():
        return True
    overlap = len(content_tokens & query_tokens) / len(content_tokens | query_tokens)
    return overlap >= 0.7


def validate_text(when_to_use: Any, content: Any, query: str | None) -> str | None:
    """Why this pair is not a usable experience, or None when it is."""
    if not isinstance(when_to_use, str) or not isinstance(content, str):
        return "when_to_use and experience must be strings"
    when_to_use, content = normalize(when_to_use), normalize(content)
    if not WHEN_TO_USE_LIMITS[0] <= len(when_to_use) <= WHEN_TO_USE_LIMITS[1]:
        return f"when_to_use must have {WHEN_TO_USE_LIMITS[0]}-{WHEN_TO_USE_LIMITS[1]} characters, got {len(when_to_use)}"
    if not CONTENT_LIMITS[0] <= len(content) <= CONTENT_LIMITS[1]:
        return f"experience must have {CONTENT_LIMITS[0]}-{CONTENT_LIMITS[1]} characters, got {len(content)}"
    for text in (when_to_use, content):
        marker = forbidden_markup(text)
        if marker:
            return f"contains the forbidden marker or special token {marker!r}"
    if query and _restates_task(content, query):
        return "the experience only restates the task"
    return None


def parse_items(text: str, query: str, max_items: int) -> tuple[list[dict[str, Any]], str | None]:
    """Validated items from a facet answer, or an error message for the retry."""
    try:
        data = parse_json(text)
    except ValueError as exc:
        return [], f"the answer was not valid JSON ({exc})"
    if isinstance(data, dict) and isinstance(data.get("experiences"), list):
        data = data["experiences"]
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not data:
        return [], "the answer must be a non-empty JSON list of objects"
    if len(data) > max_items:
        return [], f"the answer has {len(data)} items; give at most {max_items}"
    items = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            return [], f"item {i} is not an object"
        problem = validate_text(item.get("when_to_use"), item.get("experience", item.get("content")), query)
        if problem:
            return [], f"item {i}: {problem}"
        items.append(item)
    return items, None


def _string_list(value: Any, limit: int = 10) -> list[str]:
    if not isinstance(value, list):
        return []
    return [truncate(str(v), 60) for v in value if isinstance(v, (str, int, float)) and not forbidden_markup(str(v))][:limit]


def _confidence(value: Any) -> float:
    try:
        return min(1.0, max(0.0, float(value)))
    except (TypeError, ValueError):
        return 0.6


def experience_schema(max_items: int) -> dict[str, Any]:
    """A facet's answer as JSON (`{"experiences": [...]}`, which parse_items reads), for structured outputs."""
    item = {"type": "object", "properties": {
        "when_to_use": {"type": "string", "minLength": WHEN_TO_USE_LIMITS[0], "maxLength": WHEN_TO_USE_LIMITS[1]},
        "experience": {"type": "string", "minLength": CONTENT_LIMITS[0], "maxLength": CONTENT_LIMITS[1]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 5},
        "tools_used": {"type": "array", "items": {"type": "string", "maxLength": 60}, "maxItems": 5}},
        "required": ["when_to_use", "experience", "confidence", "tags", "tools_used"], "additionalProperties": False}
    return {"type": "object", "properties": {"experiences": {"type": "array", "minItems": 1, "maxItems": max_items,
                                                             "items": item}},
            "required": ["experiences"], "additionalProperties": False}


MERGE_SCHEMA = {"type": "object", "properties": {
    "same": {"type": "boolean"},
    "when_to_use": {"type": "string", "maxLength": WHEN_TO_USE_LIMITS[1]},
    "experience": {"type": "string", "maxLength": CONTENT_LIMITS[1]}},
    "required": ["same", "when_to_use", "experience"], "additionalProperties": False}


class LLMSummarizer:
    def __init__(self, client: LLMClient, max_items: int = 3, max_tokens: int = 800) -> None:
        self.client, self.max_items, self.max_tokens = client, max_items, max_tokens
        self.author = f"llm:{client.config.model}"

    async def _ask_items(self, prompt: str, query: str) -> tuple[list[dict[str, Any]], str | None]:
        """One call and, if the answer is unusable, one retry that says what was wrong."""
        messages = [{"role": "user", "content": prompt}]
        problem = None
        for _attempt in range(2):
            try:
                result = await self.client.chat(messages, max_tokens=self.max_tokens, response_format=json_schema_format(
                    "experiences", experience_schema(self.max_items)))
            except LLMError as exc:
                return [], f"LLM call failed: {exc}"
            items, problem = parse_items(result.text, query, self.max_items)
            if problem is None:
                return items, None
            messages = messages + [
                {"role": "assistant", "content": result.text},
                {"role": "user", "content": f"That answer is unusable: {problem}. Reply again with JSON only."}]
        return [], problem

    async def summarize_group(self, views: list[TrajectoryView]) -> tuple[list[Candidate], list[str]]:
        query = views[0].query
        successes = sorted((v for v in views if v.success), key=lambda v: -v.reward)
        failures = sorted((v for v in views if not v.success), key=lambda v: v.reward)
        n = self.max_items
        facets: list[tuple[ExperienceKind, str, list[TrajectoryView]]] = []
        if successes:
            best = successes[0]
            facets.append((ExperienceKind.success, SUCCESS_PROMPT.format(
                n=n, query=query, reward=best.reward, trajectory=transcript(best)), [best]))
        if failures:
            worst = failures[0]
            facets.append((ExperienceKind.failure, FAILURE_PROMPT.format(
                n=n, query=query, reward=worst.reward, trajectory=transcript(worst)), [worst]))
        if successes and failures:
            best, worst = successes[0], failures[0]
            facets.append((ExperienceKind.comparative, COMPARATIVE_PROMPT.format(
                n=n, query=query, best_reward=best.reward, worst_reward=worst.reward, best=transcript(best, 3000),
                worst=transcript(worst, 3000)), [best, worst]))
        answers = await asyncio.gather(*(self._ask_items(prompt, query) for _, prompt, _ in facets))
        candidates, errors = [], []
        for (kind, _, sources), (items, problem) in zip(facets, answers, strict=True):
            if problem:
                errors.append(f"task {views[0].task_id} {kind.value} facet: {problem}")
                continue
            for item in items:
                candidates.append(Candidate(
                    when_to_use=normalize(item["when_to_use"]),
                    content=normalize(item.get("experience", item.get("content"))), kind=kind,
                    quality=_confidence(item.get("confidence")), author=self.author,
                    tags=_string_list(item.get("tags")), tools=_string_list(item.get("tools_used")),
                    task_ids=[views[0].task_id], trajectory_ids=[v.trajectory_id for v in sources]))
        return candidates, errors

    async def same_advice(self, a: tuple[str, str], b: tuple[str, str]) -> tuple[str, str] | None:
        """The merged (when_to_use, content) when the LLM says A and B are the same advice, else None."""
        prompt = MERGE_PROMPT.format(a_when=a[0], a_content=a[1], b_when=b[0], b_content=b[1])
        try:
            result = await self.client.chat([{"role": "user", "content": prompt}], max_tokens=self.max_tokens,
                                            response_format=json_schema_format("merge", MERGE_SCHEMA))
            data = parse_json(result.text)
        except (LLMError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("same") is not True:
            return None
        when, content = data.get("when_to_use"), data.get("experience", data.get("content"))
        if validate_text(when, content, None) is not None:
            return None
        return normalize(when), normalize(content)
