"""Held-out evaluation of a user's own agent (`trainer.eval` in an agent run): the agent itself plays k episodes
per held-out task through the gateway, graded as its training episodes are, and the results take the shape of
an in-loop evaluation (`EvalSummary`), so the summary, the studio and the science scripts read both alike.

Held-out tasks: `agent.eval_tasks` (a JSONL file shaped like `agent.tasks`), else with `agent.env` the first
`eval.tasks` task ids of the environment's `eval.split`, each given to the agent as `{task_id_field: id}` like a
training task of that environment. None of them may be a training task.

An evaluation episode gets no experience and no forced tools, and never becomes a rollout: its record is read
for its outcome, calls and tool results only. The gateway forces its sampling on every call, whatever the agent
asks for: temperature 0 with `eval.greedy`, else `rollout.temperature`, with a seed per (task, sample) that is
the same in every evaluation of the run (the in-loop evaluation's rule). An agent that crashes or times out
fails its episode, which counts 0; its error is kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llm_server.protocol import EpisodeRecord
from trainer.agents import AgentFailed, AgentRunner, read_tasks
from trainer.config import EvalConfig
from trainer.peers import EnvPeer
from trainer.rollout import EpisodeResult, EvalSummary, prompt_digest, summarize_episodes
from trainer.settings import AgentConfig, RolloutConfig


@dataclass
class HeldOut:
    """The held-out tasks of an agent run and where they came from."""

    tasks: list[dict[str, Any]]
    source: str  # "agent.eval_tasks <path>" or "<env> <split> split"
    split: str | None  # the environment's split (None for a tasks file)


async def held_out_tasks(agent: AgentConfig, settings: EvalConfig, env: EnvPeer | None,
                         training_ids: set[str]) -> HeldOut | None:
    """The run's held-out tasks; None when it has no source of them (no `agent.eval_tasks`, no `agent.env`)."""
    if agent.eval_tasks is not None:
        held = HeldOut(read_tasks(agent.eval_tasks, agent.task_id_field, "agent.eval_tasks"),
                       f"agent.eval_tasks {agent.eval_tasks}", None)
    elif agent.env is not None and env is not None:
        ids = (await env.task_ids(agent.env, settings.split))[:settings.tasks]
        if not ids:
            raise ValueError(f"trainer.eval.split: environment {agent.env!r} has no {settings.split} tasks; "
                             "choose another split or give agent.eval_tasks")
        held = HeldOut([{agent.task_id_field: t} for t in ids], f"{agent.env} {settings.split} split", settings.split)
    else:
        return None
    shared = sorted({str(t[agent.task_id_field]) for t in held.tasks} & training_ids)
    if shared:
        raise ValueError(f"trainer.eval: {len(shared)} held-out tasks of {held.source} are training tasks of "
                         f"agent.tasks (e.g. {shared[0]!r}): evaluate on tasks the agent does not train on")
    return held


def eval_sampling(settings: EvalConfig, rollout: RolloutConfig) -> float:
    """The temperature every call of a held-out episode samples with."""
    return 0.0 if settings.greedy else rollout.temperature


def episode_result(task_id: str, record: EpisodeRecord | None, outcome: float) -> EpisodeResult:
    """What an evaluation keeps of one gateway episode: one step per model call, a tool call counted where its
    result came back to the model (the agent's tools answered it), the last reply's text."""
    calls = record.calls if record is not None else []
    return EpisodeResult(task_id, outcome, len(calls), 0, (calls[-1].content or "") if calls else "",
                         bool(record is not None and record.observed),
                         prompt_digest(calls[0].train_prompt_ids) if calls else None)


async def evaluate_agent(runner: AgentRunner, tasks: Sequence[dict[str, Any]], *, k: int, temperature: float,
                         seed: int) -> EvalSummary:
    """k episodes of the agent per task, concurrently (`agent.concurrency`), as an in-loop evaluation's summary."""

    async def one(position: int, task: dict[str, Any], sample: int) -> EpisodeResult:
        task_id = runner.task_id(task)
        sampling = {"temperature": temperature, "seed": seed + 1000 * (position * k + sample)}
        try:
            played = await runner.play(task, metadata={"purpose": "evaluation", "sample": sample},
                                       sampling=sampling)
        except AgentFailed as failure:  # counts 0; its error is in the runner's stats
            return episode_result(task_id, failure.record, 0.0)
        assert played.outcome is not None
        return episode_result(task_id, played.record, played.outcome)

    episodes = await asyncio.gather(*(one(p, task, i) for p, task in enumerate(tasks) for i in range(k)))
    return summarize_episodes(episodes, k)
