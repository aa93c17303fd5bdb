"""A bounded demonstration kept with an experience: the solved trajectory's own chat turns.

A 135M policy cannot use distilled advice (it copies the `<EXP>` block back), but it can copy a solved
task shown as earlier chat turns (docs/results/learning.md, success per tier). So summarization keeps, next to the advice, the source trajectory's messages: the
task query, the assistant turns exactly as written and the observations. Only successful trajectories
give one, and only when it fits the caps whole: a demonstration cut short shows an unfinished episode.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from common.schemas import ChatMessage
from experience_manager.text import forbidden_markup, message_text, normalize, scrub_markup
from experience_manager.trajectories import TrajectoryView

ROLES = ("user", "assistant", "tool")


def demonstration_of(view: TrajectoryView, *, max_messages: int, max_chars: int) -> list[dict[str, Any]] | None:
    """The demonstration of a successful trajectory, or None (failed, too long, no assistant turn, or an
    assistant/observation text with chat markup that would break the template it is replayed into)."""
    if not view.success or max_messages <= 0 or not view.raw_messages:
        return None
    start = next((i for i, m in enumerate(view.raw_messages) if m.get("role") == "user"), None)
    if start is None:
        return None
    # The query as the task's text, never an experience block injected into it when the rollout was made.
    demo: list[dict[str, Any]] = [{"role": "user", "content": view.query}]
    for raw in view.raw_messages[start + 1:]:
        role = raw.get("role")
        if role not in ROLES:
            continue
        message: dict[str, Any] = {"role": role, "content": message_text(raw.get("content"))}
        if role == "user":
            message["content"] = normalize(scrub_markup(message["content"]))
        elif forbidden_markup(message["content"]):
            return None
        for key in ("tool_calls", "tool_call_id", "name"):
            if raw.get(key) is not None:
                message[key] = raw[key]
        demo.append(message)
    if not any(m["role"] == "assistant" for m in demo) or len(demo) > max_messages:
        return None
    if sum(len(m["content"]) for m in demo) > max_chars:
        return None
    try:  # tool_calls come from any client (the ReMe route takes plain dicts): keep only well-formed ones
        return [ChatMessage.model_validate(m).model_dump(mode="json", exclude_none=True) for m in demo]
    except ValidationError:
        return None
