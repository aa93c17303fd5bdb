"""A gateway episode's record as a training rollout, on the ids the gateway recorded (never re-tokenized text).

Calls whose context continues the previous call's sampled ids (`GatewayCall.extends`) merge into one
multi-turn segment: the first call's prompt without experience, then each call's sampled ids (loss mask 1)
with the ids between them (the turn's closing, tool results, user turns, the next assistant header; mask 0).
A call that does not continue the previous one (the agent rewrote its history) starts a segment of its own:
the call trains as its own transition, and every segment of the episode shares its outcome.
Each call is one step (step id = its position in the episode), so the judge labels calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from common.schemas import ChatMessage, Step, ToolCall, ToolFunction, Trajectory
from llm_server.protocol import EpisodeRecord, GatewayCall
from trainer.rollout import Rollout
from trainer.templates import Segment

EpisodeShape = Literal["single_call", "merged", "transitions"]


@dataclass
class GatewayRollout:
    rollout: Rollout
    shape: EpisodeShape  # one call; several merged into one trajectory; several trained as transitions


def rollout_from_record(record: EpisodeRecord, *, task_id: str, outcome: float, group_id: str,
                        env_type: str | None = None, experience_ids: list[str] | None = None,
                        seconds: float = 0.0, off_policy: bool = False) -> GatewayRollout:
    """`off_policy`: accept a forced or scripted episode (the warm start's data); RL never passes it."""
    if not record.calls:
        raise ValueError(f"episode {record.episode_id} made no model call: there is nothing to train on")
    if record.mode != "policy" and not off_policy:
        raise ValueError(f"episode {record.episode_id} is {record.mode}: its replies were not sampled by the policy "
                         "as it stands, so it never trains the RL update (it feeds synthesis or the warm start)")
    segments: list[Segment] = []
    logprobs: list[float] = []
    previous: GatewayCall | None = None
    for step, call in enumerate(record.calls):
        if previous is not None and call.extends == previous.index:
            segments[-1].extend(call.glue_ids, 0, step - 1)
            logprobs += [0.0] * len(call.glue_ids)
        else:
            segments.append(Segment(prompt_ids=list(call.train_prompt_ids)))
        segments[-1].extend(call.token_ids, 1, step)
        logprobs += call.logprobs
        previous = call
    trajectory = Trajectory(
        task_id=task_id, group_id=group_id, env_type=env_type, messages=_opening(record.calls[0].messages),
        steps=_steps(record.calls), outcome=outcome,
        prompt_ids=list(segments[0].prompt_ids), response_ids=[t for s in segments for t in s.response_ids],
        loss_mask=[m for s in segments for m in s.loss_mask], step_ids=[i for s in segments for i in s.step_ids],
        logprobs=logprobs, experience_flag=record.with_experience, experience_ids=list(experience_ids or []),
        policy_version=min(c.policy_version for c in record.calls),
        metadata={"episode_id": record.episode_id, "source": "gateway"})
    shape: EpisodeShape = ("single_call" if len(record.calls) == 1
                           else "merged" if len(segments) == 1 else "transitions")
    rollout = Rollout(trajectory, segments, generated_tokens=sum(len(c.token_ids) for c in record.calls),
                      seconds=seconds, policy_versions=[c.policy_version for c in record.calls])
    return GatewayRollout(rollout, shape)


def graded_trajectory(record: EpisodeRecord, *, task_id: str, env_type: str | None) -> Trajectory:
    """The episode as a grader reads it: the agent's opening and one step per call, the last one done when its
    reply is plain text (the answer)."""
    steps = _steps(record.calls)
    if steps and not record.calls[-1].tool_calls:
        steps[-1] = steps[-1].model_copy(update={"done": True})
    return Trajectory(task_id=task_id, env_type=env_type, messages=_opening(record.calls[0].messages if record.calls
                                                                             else []), steps=steps)


def _opening(messages: list[dict[str, Any]]) -> list[ChatMessage]:
    """The agent's own opening (system and user turns before its first reply), which the judge and the experience
    manager read the task from; never the gateway's injected experience."""
    opening = []
    for message in messages:
        role = "system" if message.get("role") == "developer" else message.get("role")
        if role not in ("system", "user"):
            break
        opening.append(ChatMessage(role=role, content=_content(message)))
    return opening


def _steps(calls: list[GatewayCall]) -> list[Step]:
    """One step per call: its reply, and as observation what the agent sent after that reply in the next call."""
    steps = []
    for i, call in enumerate(calls):
        observation = _observation(call, calls[i + 1]) if i + 1 < len(calls) else None
        steps.append(Step(index=i, action=_reply(call), observation=observation,
                          info={"policy_version": call.policy_version, "tool_calls": len(call.tool_calls)}))
    return steps


def _reply(call: GatewayCall) -> ChatMessage:
    calls = [ToolCall(id=c.get("id") or f"call_{i}", function=ToolFunction(
        name=c["function"]["name"], arguments=_arguments_text(c["function"].get("arguments"))))
        for i, c in enumerate(call.tool_calls)]
    return ChatMessage(role="assistant", content=call.content or "", tool_calls=calls or None)


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments or {})


def _observation(call: GatewayCall, following: GatewayCall) -> ChatMessage | None:
    """The tool results and user turns the next call added after this call's reply, as one message."""
    ids = {c.get("id") for c in call.tool_calls}
    after = following.messages[len(call.messages) + 1:] if following.extends == call.index else [
        m for m in following.messages if m.get("role") == "tool" and m.get("tool_call_id") in ids]
    texts = [_content(m) for m in after if m.get("role") in ("tool", "user")]
    if not texts:
        return None
    role = "tool" if all(m.get("role") == "tool" for m in after) else "user"
    return ChatMessage(role=role, content="\n".join(texts))


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)
