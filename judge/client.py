"""Typed client of the judge service, the glue between trajectories and judgments, and the fingerprint of the
judge's prompt that a run's manifest records.

    async with JudgeClient("http://127.0.0.1:8005") as judge:
        response = await judge.judge_trajectories(trajectories)   # list[Trajectory]
    judgments = judgments_by_id(trajectories, response)          # trajectory id -> labels, source, ...
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

from common.http import ServiceClient
from common.schemas import ChatMessage, Trajectory
from judge.schemas import (
    BatchUsage,
    JudgeRequest,
    JudgeResponse,
    JudgeStats,
    JudgeStep,
    JudgeTrajectory,
    LabelRates,
    TrajectoryJudgment,
)

__all__ = [
    "BatchUsage", "JudgeClient", "JudgeRequest", "JudgeResponse", "JudgeStats", "JudgeStep", "JudgeTrajectory",
    "LabelRates", "TrajectoryJudgment", "judgments_by_id", "prompt_hashes", "render_action", "to_judge_trajectory",
]


def prompt_hashes() -> dict[str, str]:
    """sha256 of the judge's system prompt, and of a fixed trajectory rendered with the full template."""
    from judge.prompt import SYSTEM_PROMPT, build_messages
    from judge.settings import JudgeSettings

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


def judgments_by_id(trajectories: Sequence[Trajectory], response: JudgeResponse) -> dict[str, TrajectoryJudgment]:
    """The judgment of each trajectory (its labels, fallback, filled steps, source), by trajectory id; the
    trajectories are left as they are. Raises KeyError naming a trajectory the judge returned nothing for."""
    by_id = {j.trajectory_id: j for j in response.judgments}
    for trajectory in trajectories:
        if trajectory.trajectory_id not in by_id:
            raise KeyError(f"the judge returned no judgment for trajectory {trajectory.trajectory_id}")
    return {t.trajectory_id: by_id[t.trajectory_id] for t in trajectories}


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
