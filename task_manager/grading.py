"""Grading synthetic tasks: `grade(task, final state or trajectory) -> reward in [0, 1]`.

Where the environment exposes state, the rollout's final state is compared with the reference's
end state on the comparable view (generated ids and timestamps left out), the way BFCL's
checker compares backend states: 1.0 on a match, 0.0 otherwise. Without a state, an LLM judge
reads the task, the reference solution and the rollout and scores it on a 0-100 rubric, mapped
to [0, 1]. The verdict returned to the caller never includes the reference.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from common.llm import LLMClient
from common.schemas import Trajectory
from task_manager.envs import comparable_state
from task_manager.models import StoredTask


class GradingError(ValueError):
    """The request cannot be graded as sent; the message says what to send instead."""


@dataclass
class Grade:
    reward: float
    method: str  # state_match / llm_judge / answer_match


def state_match(stored: StoredTask, state: Any, volatile_keys: tuple[str, ...]) -> Grade:
    assert stored.reference is not None and stored.reference.end_state is not None
    if isinstance(state, dict) and "state" in state and "instance_id" in state:
        state = state["state"]  # a whole env-service state response was sent
    actual = comparable_state(state, volatile_keys)
    return Grade(1.0 if actual == stored.reference.end_state else 0.0, "state_match")


JUDGE_SYSTEM = """You grade whether an agent accomplished a task. You are given the task, a reference solution
known to accomplish it, and the agent's trajectory. Score 0-100:
- 0 if the trajectory is irrelevant to the task or only repeats itself;
- 60-100 if the goal was achieved (100 when every required effect happened, fewer points for extra
  harmful or unnecessary actions);
- 0-40 if the goal was not achieved (more points the closer it came).
The agent may take a different path than the reference; judge the effects, not the wording.
End with <reward>N</reward>."""

_REWARD = re.compile(r"<reward>\s*(\d+(?:\.\d+)?)\s*</reward>")


def judge_messages(stored: StoredTask, trajectory: Trajectory, max_chars: int = 6000) -> list[dict[str, str]]:
    assert stored.reference is not None
    steps = []
    for step in trajectory.steps:
        observation = step.observation.text() if step.observation else ""
        steps.append(f"ACTION: {step.action.text()[:800]}\nOBSERVATION: {observation[:800]}")
    if not steps:
        steps = [f"{m.role.upper()}: {m.text()[:800]}" for m in trajectory.messages if m.role != "system"]
    reference = "\n".join(stored.reference.actions)
    end_state = json.dumps(stored.reference.end_state)[:1500] if stored.reference.end_state is not None else "n/a"
    user = (f"# Task\n{stored.task.query}\n\n# Reference solution\n{reference[:2000]}\n"
            f"# Reference end state\n{end_state}\n\n# Agent trajectory\n" + "\n".join(steps)[:max_chars])
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


def parse_reward(text: str) -> float | None:
    match = _REWARD.findall(text or "")
    if not match:
        return None
    return min(max(float(match[-1]), 0.0), 100.0) / 100.0


async def llm_judge(llm: LLMClient, stored: StoredTask, trajectory: Trajectory, max_tokens: int = 256,
                    attempts: int = 2) -> Grade:
    for _ in range(attempts):
        result = await llm.chat(judge_messages(stored, trajectory), temperature=0.0, max_tokens=max_tokens)
        reward = parse_reward(result.text)
        if reward is not None:
            return Grade(reward, "llm_judge")
    raise GradingError("the judge LLM did not answer with <reward>N</reward>")
