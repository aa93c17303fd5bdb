"""The trainer's HTTP peers, each through its package's own typed client.

- environment: `env_service.client.EnvClient` (required), adapted to the agent loop's `EnvAccess`;
- experience manager: `experience_manager.client.ExperienceClient` (optional): one retrieval per task
  group, then after each step the step's trajectories to summarize and usage feedback (reward and the
  same group's no-experience baseline) for every rollout that was given experience;
- task manager: `task_manager.client.TaskClient` (optional): training batches (original and
  synthetic tasks), grading of synthetic tasks from the state snapshot read before release, and
  pass-rate feedback for its curriculum;
- judge: `advantage.client.JudgeClient` (optional, needed by `adca_grpo`): GOOD/BAD step labels.

Each peer counts what it did, so the end-of-run summary can say what every mechanism contributed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from advantage.client import JudgeClient, apply_judgments
from common.schemas import Task, Trajectory
from env_service.client import EnvClient
from env_service.protocol import CreateResponse, EvaluateResponse, StepResponse
from experience_manager.client import ExperienceClient, FeedbackItem
from task_manager.client import TaskClient


class EnvPeer:
    """create -> step* -> evaluate -> state -> release, for the agent loop."""

    def __init__(self, base_url: str, *, timeout: float = 120.0) -> None:
        self.client = EnvClient(base_url, timeout=timeout)

    async def create(self, env: str, task: Task) -> CreateResponse:
        # Not retried by the client (a create without a caller-chosen id); the rollout's bounded retry covers it.
        return await self.client.create(env, task.env_task_id, task.create_params())

    async def step(self, instance_id: str, action: str) -> StepResponse:
        return await self.client.step(instance_id, action)

    async def evaluate(self, instance_id: str, params: dict[str, Any] | None = None) -> EvaluateResponse:
        return await self.client.evaluate(instance_id, params)

    async def state(self, instance_id: str) -> dict[str, Any] | None:
        return (await self.client.state(instance_id)).state

    async def release(self, instance_id: str) -> bool:
        return await self.client.release(instance_id)

    async def task_ids(self, env: str, split: str) -> list[str]:
        return await self.client.task_ids(env, split)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        await self.client.aclose()


@dataclass
class ExperienceCounters:
    retrievals: int = 0
    hits: int = 0  # retrievals that returned at least one experience
    injected_rollouts: int = 0
    summarized_trajectories: int = 0
    experiences_created: int = 0
    experiences_updated: int = 0
    feedback_items: int = 0
    feedback_with_baseline: int = 0


class ExperiencePeer:
    """Retrieval for the agent loop (`ExperienceSource`) and the after-step feedback."""

    def __init__(self, base_url: str, workspace: str, *, top_k: int | None = None,
                 min_similarity: float | None = None, summarize_mode: str | None = None,
                 timeout: float = 300.0) -> None:
        self.client = ExperienceClient(base_url, timeout=timeout)
        self.workspace, self.top_k, self.min_similarity = workspace, top_k, min_similarity
        self.summarize_mode = summarize_mode
        self.counters = ExperienceCounters()

    async def start(self) -> None:
        await self.client.create_workspace(self.workspace)  # PUT: idempotent

    async def retrieve(self, query: str) -> tuple[str, list[str]] | None:
        got = await self.client.retrieve(self.workspace, query, top_k=self.top_k,
                                         min_similarity=self.min_similarity)
        self.counters.retrievals += 1
        if not got.experience_ids or not got.rendered.strip():
            return None
        self.counters.hits += 1
        return got.rendered, list(got.experience_ids)

    async def after_step(self, groups: list[list[Trajectory]], *, summarize: bool, feedback: bool,
                         request_id: str) -> None:
        """Summarize the step's trajectories; report each experience-given rollout against its group's
        rollouts without experience (the baseline the experience manager scores advantage with)."""
        trajectories = [t for g in groups for t in g]
        self.counters.injected_rollouts += sum(t.experience_flag for t in trajectories)
        if feedback:
            items = []
            for group in groups:
                plain = [float(t.outcome or 0.0) for t in group if not t.experience_flag]
                baseline = sum(plain) / len(plain) if plain else None
                for t in group:
                    if t.experience_flag and t.experience_ids:
                        reward = float(t.outcome or 0.0)
                        items.append(FeedbackItem(experience_ids=list(t.experience_ids), reward=reward,
                                                  success=reward >= 1.0, baseline=baseline))
            if items:
                await self.client.feedback(self.workspace, items, request_id=f"{request_id}-feedback")
                self.counters.feedback_items += len(items)
                self.counters.feedback_with_baseline += sum(i.baseline is not None for i in items)
        if summarize and trajectories:
            result = await self.client.summarize(self.workspace, trajectories, mode=self.summarize_mode,  # type: ignore[arg-type]
                                                 request_id=f"{request_id}-summarize")
            self.counters.summarized_trajectories += len(trajectories)
            self.counters.experiences_created += len(result.created)
            self.counters.experiences_updated += len(result.updated)

    async def stats(self) -> dict[str, Any]:
        return await self.client.stats(self.workspace)

    def summary(self) -> dict[str, Any]:
        c = self.counters
        return {**asdict(c), "hit_rate": c.hits / c.retrievals if c.retrievals else 0.0}

    async def aclose(self) -> None:
        await self.client.aclose()


@dataclass
class TaskCounters:
    batches: int = 0
    tasks_sampled: int = 0
    synthetic_sampled: int = 0
    synthetic_graded: int = 0
    synthetic_reward_sum: float = 0.0
    feedback_tasks: int = 0


class TaskPeer:
    """Training batches from the task manager and grading of its synthetic tasks (`SyntheticGrader`)."""

    def __init__(self, base_url: str, *, synthetic_ratio: float | None = None, timeout: float = 120.0) -> None:
        self.client = TaskClient(base_url, timeout=timeout)
        self.synthetic_ratio = synthetic_ratio
        self.counters = TaskCounters()

    async def sample(self, batch_size: int, env: str, seed: int) -> list[Task]:
        tasks = await self.client.sample_batch(batch_size, env=env, synthetic_ratio=self.synthetic_ratio, seed=seed)
        if not tasks:
            raise RuntimeError(f"the task manager returned no tasks for env {env!r}; does it serve that environment?")
        self.counters.batches += 1
        self.counters.tasks_sampled += len(tasks)
        self.counters.synthetic_sampled += sum(t.synthetic for t in tasks)
        return tasks

    async def grade(self, task: Task, state: dict[str, Any] | None, trajectory: Trajectory) -> float:
        reward = await self.client.grade(task.task_id, state=state, trajectory=trajectory)
        self.counters.synthetic_graded += 1
        self.counters.synthetic_reward_sum += reward
        return reward

    async def feedback(self, trajectories: list[Trajectory], env: str) -> None:
        outcomes: dict[str, list[float]] = defaultdict(list)
        for t in trajectories:
            outcomes[t.task_id].append(float(t.outcome or 0.0))
        if outcomes:
            self.counters.feedback_tasks += await self.client.feedback(dict(outcomes), env_type=env)

    async def stats(self) -> dict[str, Any]:
        return await self.client.stats()

    def summary(self) -> dict[str, Any]:
        return asdict(self.counters)

    async def aclose(self) -> None:
        await self.client.aclose()


@dataclass
class JudgeCounters:
    batches: int = 0
    trajectories: int = 0
    steps_labelled: int = 0
    good: int = 0
    bad: int = 0
    fallbacks: int = 0  # trajectories whose labels are all the outcome's sign
    parsed_labels: int = 0  # labels read from the judge's output before any filling
    filled_steps: int = 0


class JudgePeer:
    """GOOD/BAD step labels for every rollout of a step, written onto the trajectories."""

    def __init__(self, base_url: str, *, timeout: float = 900.0) -> None:
        self.client = JudgeClient(base_url, timeout=timeout)
        self.counters = JudgeCounters()

    async def label(self, trajectories: list[Trajectory]) -> None:
        if not trajectories:
            return
        response = await self.client.judge_trajectories(trajectories)
        apply_judgments(trajectories, response)
        c = self.counters
        c.batches += 1
        c.trajectories += len(trajectories)
        for judgment in response.judgments:
            c.steps_labelled += len(judgment.labels)
            c.good += sum(label.label == "GOOD" for label in judgment.labels)
            c.bad += sum(label.label == "BAD" for label in judgment.labels)
            c.fallbacks += int(judgment.fallback)
            c.parsed_labels += judgment.parsed_labels
            c.filled_steps += len(judgment.filled_steps)

    async def stats(self) -> dict[str, Any]:
        return (await self.client.stats()).model_dump()

    def summary(self) -> dict[str, Any]:
        c = self.counters
        return {**asdict(c), "parse_rate": c.parsed_labels / c.steps_labelled if c.steps_labelled else 0.0,
                "fallback_rate": c.fallbacks / c.trajectories if c.trajectories else 0.0}

    async def aclose(self) -> None:
        await self.client.aclose()
