"""The agent runner: a user's own agent, run k times per task through the gateway, its episodes as rollouts.

The agent is an importable callable `async def agent(task: dict, base_url: str) -> reward or answer`, or a
command line that reads the task as JSON on stdin, finds the base URL in `OPENAI_BASE_URL` (and
`EVOLVER_BASE_URL`), and prints its answer (or `{"reward": x}` / `{"answer": ...}`) as its last stdout line.
Its OpenAI client points at the episode's URL; every call it makes is recorded by the gateway.

The outcome of an episode, in order: the environment's evaluate (an env-backed task without a grader: the runner
created its instance and put `{"url", "instance_id", "name", "messages"}` in the task under `env`); the number the
agent returned; the grader's score of what it returned. An agent that raises, exits non-zero or runs past `timeout_s` fails its
episode: the error goes into the summary and the group is not trained (its partial calls never train).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger

from common.schemas import Task, new_id
from llm_server.client import LLMServerClient
from llm_server.protocol import EpisodeRecord
from trainer.gateway_rollouts import graded_trajectory, rollout_from_record
from trainer.mechanisms import ExperienceSource, GroupExperience, experience_flags
from trainer.peers import TaskPeer
from trainer.rollout import EnvAccess, Rollout
from trainer.settings import AgentConfig

AgentFn = Callable[[dict[str, Any], str], Awaitable[Any]]
GraderFn = Callable[[dict[str, Any], Any], Any]


class AgentFailed(RuntimeError):
    """The agent crashed, timed out or gave nothing to grade: its episode fails. `record`: what the gateway
    recorded of it until then (None when no episode was opened)."""

    record: EpisodeRecord | None = None


def read_tasks(path: str, task_id_field: str, what: str = "agent.tasks") -> list[dict[str, Any]]:
    """The JSONL tasks of setting `what`; a task without an id gets its line number as one."""
    tasks = []
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{what}: {path} is not a file")
    for number, line in enumerate(file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{what}: {path} line {number} is not JSON: {exc}") from None
        if not isinstance(task, dict):
            raise ValueError(f"{what}: {path} line {number} is not a JSON object")
        task.setdefault(task_id_field, f"line-{number}")
        tasks.append(task)
    if not tasks:
        raise ValueError(f"{what}: {path} holds no task")
    return tasks


def import_callable(spec: str, what: str) -> Callable[..., Any]:
    """`package.module:function` -> the function (the working directory is importable, as for `python -m`)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{what}: {spec!r} must be 'module:function', e.g. 'my_agent:agent'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{what}: cannot import {spec!r}: {exc}") from exc
    if not callable(function):
        raise ValueError(f"{what}: {spec!r} is not callable")
    return function


def command_agent(command: Sequence[str]) -> AgentFn:
    """A command line as an agent: the task as JSON on stdin, the base URL in the environment."""

    async def agent(task: dict[str, Any], base_url: str) -> Any:
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "EVOLVER_BASE_URL": base_url,
               "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "evolver")}
        process = await asyncio.create_subprocess_exec(*command, stdin=asyncio.subprocess.PIPE,
                                                       stdout=asyncio.subprocess.PIPE,
                                                       stderr=asyncio.subprocess.PIPE, env=env)
        try:
            out, err = await process.communicate(json.dumps(task).encode())
        except asyncio.CancelledError:  # a timeout: the process must not outlive its episode
            process.kill()
            await process.wait()
            raise
        if process.returncode != 0:
            tail = err.decode(errors="replace").strip()[-800:]
            raise AgentFailed(f"the agent command exited with {process.returncode}: {tail}")
        lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
        if not lines:
            return None
        try:
            return json.loads(lines[-1])
        except ValueError:
            return lines[-1]

    return agent


def make_agent(config: AgentConfig) -> AgentFn:
    if config.command:
        return command_agent(config.command)
    assert config.callable is not None
    function = import_callable(config.callable, "agent.callable")
    if not inspect.iscoroutinefunction(function):
        raise ValueError(f"agent.callable: {config.callable!r} must be an async function "
                         "`async def agent(task, base_url)`")
    return function


def reward_of(returned: Any) -> float | None:
    """The agent's own reward: a number, or `{"reward": number}`; None when it returned something else."""
    value = returned.get("reward") if isinstance(returned, dict) else returned
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value):
        raise AgentFailed(f"the agent returned a reward that is not finite: {value}")
    return float(value)


def answer_of(returned: Any) -> Any:
    return returned.get("answer", returned) if isinstance(returned, dict) else returned


@dataclass
class Played:
    """One episode as played: the gateway's record, what the agent returned, its outcome (None: not graded)."""

    record: EpisodeRecord
    returned: Any
    outcome: float | None
    experience_ids: list[str] | None = None


@dataclass
class RunnerStats:
    """What the summary reports of gateway episodes."""

    groups: int = 0
    episodes: int = 0
    failed_episodes: int = 0
    dropped_groups: int = 0
    retrievals: int = 0  # experience retrievals (one per group given experience)
    single_call: int = 0
    merged: int = 0  # several calls, one multi-turn trajectory
    transitions: int = 0  # several calls, trained as separate transitions sharing the outcome
    calls: int = 0
    with_experience: int = 0
    errors: list[str] = field(default_factory=list)  # the last failures, "task_id: error"

    def failed(self, task_id: str, error: str) -> None:
        self.failed_episodes += 1
        self.errors = [*self.errors, f"{task_id}: {error}"[:500]][-20:]

    def summary(self) -> dict[str, Any]:
        multi = self.merged + self.transitions
        return {**{k: v for k, v in vars(self).items()}, "merge_rate": self.merged / multi if multi else None}


class AgentRunner:
    """k episodes per task, concurrently; complete groups of rollouts, in task order."""

    def __init__(self, config: AgentConfig, gateway: LLMServerClient, agent: AgentFn, *,
                 grader: GraderFn | None = None, env: EnvAccess | None = None, env_url: str | None = None,
                 experience: ExperienceSource | None = None, experience_ratio: float = 0.0,
                 task_grader: TaskPeer | None = None) -> None:
        if env is None and grader is None and config.env is not None:
            raise ValueError("agent.env needs the environment service (services.env_url)")
        self.config, self.gateway, self.agent, self.grader = config, gateway, agent, grader
        self.env, self.env_url = env, env_url
        self.experience, self.experience_ratio = experience, experience_ratio
        self.task_grader = task_grader
        self.synthetic: dict[str, Task] = {}  # synthetic task id -> its environment task (seed and query)
        self.stats = RunnerStats()
        self._limit = asyncio.Semaphore(config.concurrency)

    def query(self, task: dict[str, Any]) -> str:
        """The task's query text (experience is retrieved by it): its `query_field`, else an env-backed task's
        opening user message."""
        value = task.get(self.config.query_field)
        if isinstance(value, str):
            return value
        opening = [m.get("content") for m in (task.get("env") or {}).get("messages", []) if m.get("role") == "user"]
        if opening and isinstance(opening[-1], str):
            return opening[-1]
        raise ValueError(f"task {self.task_id(task)!r} has no text under agent.query_field "
                         f"{self.config.query_field!r}; its fields are {sorted(task)}")

    def task_id(self, task: dict[str, Any]) -> str:
        return str(task.get(self.config.task_id_field, ""))

    async def collect(self, tasks: Sequence[dict[str, Any]], k: int) -> list[list[Rollout]]:
        groups = await asyncio.gather(*(self._group(task, k) for task in tasks))
        return [g for g in groups if g is not None]

    async def _group(self, task: dict[str, Any], k: int) -> list[Rollout] | None:
        group_id = new_id("grp")
        shared = GroupExperience(self.experience) if self.experience is not None and self.experience_ratio else None
        flags = experience_flags(k, self.experience_ratio if shared is not None else 0.0)
        results = await asyncio.gather(*(self._episode(task, group_id, shared if flags[i] else None)
                                         for i in range(k)), return_exceptions=True)
        self.stats.groups += 1
        self.stats.retrievals += shared.retrievals if shared is not None else 0
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            self.stats.dropped_groups += 1
            logger.warning("dropping the group of task {}: {} of {} episodes failed ({})", self.task_id(task),
                           len(failures), k, failures[0])
            return None
        return list(results)  # type: ignore[arg-type]

    async def _episode(self, task: dict[str, Any], group_id: str, shared: GroupExperience | None) -> Rollout:
        started = time.monotonic()
        played = await self.play(task, shared=shared, metadata={"group_id": group_id})
        record = played.record
        assert played.outcome is not None
        built = rollout_from_record(record, task_id=self.task_id(task), outcome=played.outcome, group_id=group_id,
                                    env_type=self.config.env, experience_ids=played.experience_ids,
                                    seconds=time.monotonic() - started)
        stats = self.stats
        stats.calls += len(record.calls)
        stats.with_experience += record.with_experience
        setattr(stats, built.shape, getattr(stats, built.shape) + 1)
        return built.rollout

    async def play(self, task: dict[str, Any], *, shared: GroupExperience | None = None,
                   metadata: dict[str, Any] | None = None, force_tools: bool = False,
                   tool_arguments: dict[str, dict[str, list[Any]]] | None = None,
                   script: list[str] | None = None, script_results: list[str] | None = None,
                   grade: bool = True, sampling: dict[str, Any] | None = None) -> Played:
        """One episode of the agent on `task` (its own environment instance when `agent.env` is set), graded unless
        `grade` is false; `force_tools` / `script` make it an off-policy episode (exploration, a reference played
        through the agent; `script_results`: what the reference's calls returned, so that the ids they generated
        are this run's in the later replies); `sampling` (`{"temperature", "seed"}`) is forced on every call of the
        episode by the gateway. An agent that fails, or an episode cut or without a model call, raises AgentFailed."""
        task_id = self.task_id(task)
        async with self._limit:
            self.stats.episodes += 1
            episode_id: str | None = None
            instance_id: str | None = None
            try:
                payload = dict(task)
                if self.config.env is not None and self.env is not None:
                    created = await self.env.create(self.config.env, self.env_task(task))
                    instance_id = created.instance_id
                    payload["env"] = {"url": self.env_url, "instance_id": instance_id, "name": self.config.env,
                                      "messages": [m.model_dump(exclude_none=True) for m in created.messages]}
                experience = await shared.get(self.query(payload)) if shared is not None else None
                opened = await self.gateway.open_episode(experience.text if experience else None,
                                                         {"task_id": task_id, **(metadata or {})},
                                                         force_tools=force_tools, tool_arguments=tool_arguments,
                                                         script=script, script_results=script_results,
                                                         sampling=sampling)
                episode_id = opened.episode_id
                returned = await asyncio.wait_for(self.agent(payload, self.gateway.episode_url(episode_id)),
                                                  self.config.timeout_s)
                record = await self.gateway.end_episode(episode_id)
                if record.ended_reason == "weight_update":
                    raise AgentFailed("cut by a weight update (gateway_drain_timeout_s)")
                if not record.calls:
                    raise AgentFailed("the agent made no model call through its base_url")
                outcome = await self._outcome(task, returned, instance_id, record) if grade else None
            except Exception as exc:
                # Its calls so far are closed and never trained (exploration still reads what its tools returned).
                record = await self.gateway.end_episode(episode_id) if episode_id is not None else None
                error = (f"timed out after {self.config.timeout_s} s" if isinstance(exc, asyncio.TimeoutError)
                         else str(exc) if isinstance(exc, AgentFailed) else f"{type(exc).__name__}: {exc}")
                self.stats.failed(task_id, error)
                failure = exc if isinstance(exc, AgentFailed) else AgentFailed(error)
                failure.record = record
                raise failure from (None if failure is exc else exc)
            finally:
                if instance_id is not None and self.env is not None:
                    try:
                        await self.env.release(instance_id)
                    except Exception as exc:  # the env service reaps it later
                        logger.warning("release of {} failed: {}", instance_id, exc)
        return Played(record, returned, outcome, experience.ids if experience else None)

    def env_task(self, task: dict[str, Any]) -> Task:
        """The environment task an episode of `task` starts: a synthetic task starts its seed task with its own
        query."""
        task_id = self.task_id(task)
        assert self.config.env is not None
        return self.synthetic.get(task_id) or Task(task_id=task_id, env_type=self.config.env)

    async def _outcome(self, task: dict[str, Any], returned: Any, instance_id: str | None,
                       record: EpisodeRecord) -> float:
        synthetic = self.synthetic.get(self.task_id(task))
        if synthetic is not None:  # graded against its reference by the task manager that made it
            if self.task_grader is None:
                raise AgentFailed(f"task {synthetic.task_id!r} is synthetic and no task manager grades it")
            state = await self.env.state(instance_id) if instance_id is not None and self.env is not None else None
            trajectory = graded_trajectory(record, task_id=synthetic.task_id, env_type=self.config.env)
            return await self.task_grader.grade(synthetic, state, trajectory)
        if instance_id is not None and self.env is not None and self.grader is None:
            return float((await self.env.evaluate(instance_id)).score)
        own = reward_of(returned)
        if own is not None:
            return own
        if self.grader is None:
            raise AgentFailed("the agent returned no reward (a number or {\"reward\": x}) and agent.grader is not "
                              f"set; it returned {str(returned)[:200]!r}")
        score = self.grader(task, answer_of(returned))
        if inspect.isawaitable(score):
            score = await score
        value = reward_of(score)
        if value is None:
            raise AgentFailed(f"agent.grader returned {score!r}, not a number")
        return value
