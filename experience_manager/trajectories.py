"""Turn incoming trajectories (ours or ReMe's `{messages, score}`) into one plain view for summarizers."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from common.schemas import Trajectory
from experience_manager.text import message_text, normalize, scrub_markup, task_text_from_messages

_TOOL_TAG_RE = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
_JSON_BLOCK_RE = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)
_ERROR_RE = re.compile(r"error|exception|traceback|failed|invalid|not found|denied|refused|unknown", re.IGNORECASE)


@dataclass
class ToolUse:
    name: str
    arg_names: list[str]

    def render(self) -> str:
        return f"{self.name}({', '.join(self.arg_names)})"


@dataclass
class TrajectoryView:
    trajectory_id: str
    task_id: str
    query: str
    messages: list[dict[str, Any]]  # role + content (str) only, markup scrubbed
    tool_uses: list[ToolUse]
    reward: float
    success: bool
    last_error: str | None = None
    final_answer: str = ""
    steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    raw_messages: list[dict[str, Any]] = field(default_factory=list)  # as sent, for demonstrations
    task_kind: str | None = None  # the trajectory's `metadata.task_kind`, when it has one


def _arguments(raw: Any) -> dict:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


def _tool_uses(message: dict[str, Any]) -> list[ToolUse]:
    uses = []
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:  # clients send anything here: 5, a dict, a string
        if not isinstance(call, dict):
            continue
        function = call.get("function") if isinstance(call.get("function"), dict) else call
        name = str(function.get("name") or "").strip()
        if name:
            uses.append(ToolUse(name, sorted(_arguments(function.get("arguments")).keys())))
    if uses:
        return uses
    # Text agents write calls into the content: <tool_call>{...}</tool_call> or a ```json block.
    text = message_text(message.get("content"))
    for raw in _TOOL_TAG_RE.findall(text) or _JSON_BLOCK_RE.findall(text):
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            args = obj.get("arguments", obj.get("parameters", {}))
            uses.append(ToolUse(obj["name"], sorted(_arguments(args).keys())))
    return uses


def _last_error(messages: list[dict[str, Any]]) -> str | None:
    for message in reversed(messages):
        if message["role"] in ("tool", "user") and message is not messages[0]:
            for line in reversed(message["content"].splitlines()):
                if _ERROR_RE.search(line):
                    return normalize(line)[:200]
    return None


def build_view(*, messages: list[Any], reward: float, success_threshold: float, trajectory_id: str | None,
               task_id: str | None, query: str | None) -> TrajectoryView:
    plain: list[dict[str, Any]] = []
    tool_uses: list[ToolUse] = []
    for raw in messages:
        if not isinstance(raw, dict):
            continue
        role = str(raw.get("role", ""))
        content = normalize(scrub_markup(message_text(raw.get("content"))))
        plain.append({"role": role, "content": content})
        if role == "assistant":
            tool_uses.extend(_tool_uses(raw))
    task = normalize(scrub_markup(query)) if query else task_text_from_messages(plain)
    if not task_id:
        task_id = "task_" + hashlib.sha256(task.lower().encode()).hexdigest()[:16]
    if not trajectory_id:
        digest = hashlib.sha256(json.dumps([plain, reward], sort_keys=True).encode()).hexdigest()[:16]
        trajectory_id = f"traj_{digest}"
    final = next((m["content"] for m in reversed(plain) if m["role"] == "assistant" and m["content"]), "")
    return TrajectoryView(trajectory_id=trajectory_id, task_id=task_id, query=task, messages=plain,
                          tool_uses=tool_uses, reward=float(reward), success=float(reward) >= success_threshold,
                          last_error=_last_error(plain), final_answer=final,
                          steps=sum(1 for m in plain if m["role"] == "assistant"),
                          raw_messages=[m for m in messages if isinstance(m, dict)])


def view_of_trajectory(trajectory: Trajectory, success_threshold: float) -> TrajectoryView:
    messages = [m.model_dump(exclude_none=True) for m in trajectory.messages]
    if not messages:  # a trajectory recorded only as steps: rebuild the conversation from them
        for step in trajectory.steps:
            messages.append(step.action.model_dump(exclude_none=True))
            if step.observation is not None:
                messages.append(step.observation.model_dump(exclude_none=True))
    query = trajectory.metadata.get("query") if isinstance(trajectory.metadata.get("query"), str) else None
    view = build_view(messages=messages, reward=trajectory.outcome or 0.0, success_threshold=success_threshold,
                      trajectory_id=trajectory.trajectory_id, task_id=trajectory.task_id, query=query)
    kind = trajectory.metadata.get("task_kind")
    view.task_kind = kind if isinstance(kind, str) and kind else None
    return view


def transcript(view: TrajectoryView, limit: int = 6000) -> str:
    """A compact transcript for an LLM prompt; the middle is cut when it is too long."""
    lines = []
    for message in view.messages:
        content = message["content"]
        if len(content) > 600:
            content = content[:600] + " …"
        lines.append(f"[{message['role']}] {content}")
    text = "\n".join(lines)
    if len(text) > limit:
        text = text[: limit // 2] + "\n[… middle of the trajectory omitted …]\n" + text[-limit // 2:]
    return text
