"""Typed client of the judge service, the glue between trajectories and judgments, and the fingerprint of the
judge's prompt that a run's manifest records.

    async with JudgeClient("http://127.0.0.1:8005") as judge:
        response = await judge.judge_trajectories(trajectories)   # list[Trajectory]
    apply_judgments(trajectories, response)                      # sets trajectory.labels
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

from advantage.judge.schemas import (
    BatchUsage,
    JudgeRequest,
    JudgeResponse,
    JudgeStats,
    JudgeStep,
    JudgeTrajectory,
    LabelRates,
    TrajectoryJudgment,
)
from common.http import ServiceClient
from common.schemas import ChatMessage, Trajectory

__all__ = [
    "BatchUsage", "JudgeClient", "JudgeRequest", "JudgeResponse", "JudgeStats", "JudgeStep", "JudgeTrajectory",
    "LabelRates", "TrajectoryJudgment", "apply_judgments", "prompt_hashes", "render_action", "to_judge_trajectory",
]


def prompt_hashes() -> dict[str, str]:
    """sha256 of the judge's system prompt, and of a fixed trajectory rendered with the full template."""
    from advantage.judge.prompt import SYSTEM_PROMPT, build_messages
    from advantage.judge.settings import JudgeSettings

    defaults = JudgeSettings()
    probe = JudgeTrajectory(trajectory_id="manifest-probe", query="book the cheapest flight",
                            steps=[JudgeStep(action="search_flight()", observation="3 flights")], outcome=1.0)
    rendered = build_messages(probe, max_step_chars=defaults.max_step_chars, max_query_chars=defaults.max_query_chars,
                              success_threshold=defaults.success_threshold)
    return {"system_prompt_sha256": hashlib.sha256(SYSTEM_PROMPT.encode()).hexdigest(),
            "rendered_template_sha256": hashlib.sha256(json.dumps(rendered, sort_keys=True).encode()).hexdigest()}


def render_action(message: ChatMessage) -> str:
    """The agent's turn as text: what it said and the tool calls it made."""
    parts = [message.text()] if message.text() else []
    for call in message.tool_calls or []:
        parts.append(f"[tool call] {call.function.name}({call.function.arguments})")
    return "\n".join(parts)


def task_query(trajectory: Trajectory) -> str:
    """The task description: the first user message of the rollout."""
    for message in trajectory.messages:
        if message.role == "user" and message.text():
            return message.text()
    return ""


def to_judge_trajectory(trajectory: Trajectory, query: str | None = None) -> JudgeTrajectory:
    if trajectory.outcome is None:
        raise ValueError(f"trajectory {trajectory.trajectory_id} has no outcome; grade it before judging")
    return JudgeTrajectory(
        trajectory_id=trajectory.trajectory_id, task_id=trajectory.task_id,
        query=query if query is not None else task_query(trajectory),
        steps=[JudgeStep(action=render_action(step.action),
                         observation=step.observation.text() if step.observation is not None else None)
               for step in trajectory.steps],
        outcome=trajectory.outcome,
    )


def apply_judgments(trajectories: Sequence[Trajectory], response: JudgeResponse) -> None:
    """Set `labels` (and metadata judge_fallback / judge_filled_steps / judge_source) on each trajectory, by id."""
    by_id = {j.trajectory_id: j for j in response.judgments}
    for trajectory in trajectories:
        judgment = by_id.get(trajectory.trajectory_id)
        if judgment is None:
            raise KeyError(f"the judge returned no judgment for trajectory {trajectory.trajectory_id}")
        trajectory.labels = list(judgment.labels)
        trajectory.metadata["judge_fallback"] = judgment.fallback
        trajectory.metadata["judge_filled_steps"] = list(judgment.filled_steps)
        trajectory.metadata["judge_source"] = judgment.source


class JudgeClient(ServiceClient):
    def __init__(self, base_url: str, *, timeout: float = 900.0, **kwargs) -> None:
        # Judging a batch waits on LLM generations: the default timeout is long.
        super().__init__(base_url, timeout=timeout, **kwargs)

    async def judge(self, trajectories: Sequence[JudgeTrajectory], *, timeout: float | None = None) -> JudgeResponse:
        body = JudgeRequest(trajectories=list(trajectories)).model_dump(mode="json")
        # Safe to retry: judging is a pure function of the content, and the service caches it.
        return await self.post("/v1/judge", json=body, model=JudgeResponse, idempotent=True, timeout=timeout)

    async def judge_trajectories(self, trajectories: Sequence[Trajectory], *,
                                 queries: Mapping[str, str] | None = None,
                                 timeout: float | None = None) -> JudgeResponse:
        """Judge rollouts; `queries` (by trajectory id) overrides the task text taken from the messages."""
        items = [to_judge_trajectory(t, (queries or {}).get(t.trajectory_id)) for t in trajectories]
        return await self.judge(items, timeout=timeout)

    async def stats(self) -> JudgeStats:
        return await self.get("/v1/stats", model=JudgeStats)
