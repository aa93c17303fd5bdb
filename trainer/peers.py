"""The trainer's HTTP peers, each through its package's own typed client.

- environment: `env_service.client.EnvClient` (required), adapted to the agent loop's `EnvAccess`;
- experience manager: `experience_manager.client.ExperienceClient` (optional): one retrieval per task
  group, then after each step the step's trajectories to summarize and usage feedback (reward and the
  same group's no-experience baseline) for every rollout that was given experience;
- task manager: `task_manager.client.TaskClient` (optional): training batches (original and
  synthetic tasks), grading of synthetic tasks from the state snapshot read before release, and
  pass-rate feedback for its curriculum;
- judge: `judge.client.JudgeClient` (optional, needed by `adca_grpo`): GOOD/BAD step labels.

Each peer counts what it did, so the end-of-run summary can say what every mechanism contributed.

Every client rides out its peer's outages under one `OutagePolicy` (see `common.http.ServiceClient`):
unreachable or 503 -> wait on `/healthz` and send again, up to the outage budget, then an error that
names the peer and its launcher log. Two degradations are allowed, both counted and listed in the
run summary: the judge down past `judge_fallback_after_s` -> that batch gets the outcome's sign as
every step's label, a judgment flagged `fallback` (what the judge itself does when its LLM's answer does
not parse); the experience manager down when a step's summaries and feedback are due -> they are
queued under their request ids and delivered when it is back (the service applies an id once).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger

from common.http import OutageCounters, PeerUnavailable, ServiceCallError, ServiceClient
from common.schemas import ChatMessage, Task, Trajectory
from env_service.client import EnvClient
from env_service.protocol import CreateResponse, EvaluateResponse, StepResponse
from experience_manager.client import ExperienceClient, FeedbackItem
from judge.client import JudgeClient, TrajectoryJudgment, judgments_by_id
from judge.schemas import fallback_labels
from task_manager.client import TaskClient
from trainer.asks import Hit, retrieved_ids


@dataclass(frozen=True)
class OutagePolicy:
    """How long the trainer waits for a peer that is down, and where the launcher logs each peer.

    A peer built without one gets these defaults (the veRL plugin's peers, `trainer.evaluate`); the
    local trainer passes its `trainer.services` settings."""

    budget_s: float = 120.0
    judge_fallback_after_s: float = 30.0
    logs_dir: str | None = None

    def client_options(self, service: str, *, budget_s: float | None = None) -> dict[str, Any]:
        log = str(Path(self.logs_dir) / f"{service}.log") if self.logs_dir else None
        return {"peer": service, "outage_budget_s": self.budget_s if budget_s is None else budget_s, "log_hint": log}


def is_outage(exc: BaseException) -> bool:
    """The peer was down (unreachable, or 503 while starting), as opposed to refusing the request."""
    return isinstance(exc, ServiceCallError) and (exc.code in ("unreachable", "peer_unavailable")
                                                  or exc.status == 503)


class EnvPeer:
    """create -> step* -> evaluate -> state -> release, for the agent loop."""

    def __init__(self, base_url: str, *, timeout: float = 120.0, outage: OutagePolicy | None = None) -> None:
        self.client = EnvClient(base_url, timeout=timeout, **(outage or OutagePolicy()).client_options("env_service"))

    async def create(self, env: str, task: Task) -> CreateResponse:
        # A caller-chosen instance id makes the create idempotent: sent again after a dropped
        # connection it cannot make a second instance (the service answers 409 instead).
        return await self.client.create(env, task.env_task_id, task.create_params(),
                                        instance_id=f"inst-{uuid.uuid4().hex}")

    async def step(self, instance_id: str, action: str) -> StepResponse:
        return await self.client.step(instance_id, action)

    async def evaluate(self, instance_id: str, params: dict[str, Any] | None = None) -> EvaluateResponse:
        return await self.client.evaluate(instance_id, params)

    async def state(self, instance_id: str) -> dict[str, Any] | None:
        return (await self.client.state(instance_id)).state

    async def release(self, instance_id: str) -> bool:
        return await self.client.release(instance_id)

    async def fork(self, instance_id: str) -> str:
        """A copy of the instance in its current state (the paired branch's), by a caller-chosen id so that a
        retried fork cannot make two; the copy's id."""
        return (await self.client.fork(instance_id, f"{instance_id}-branch")).instance_id

    async def state_hash(self, instance_id: str) -> str | None:
        return (await self.client.state(instance_id)).state_hash

    async def capabilities(self, env: str) -> dict[str, bool]:
        """What environment `env` declares beyond the protocol: `fork` (its instances copy their state) and
        `deterministic` (replayed actions reach the same state)."""
        return await self.client.capabilities(env)

    async def task_ids(self, env: str, split: str) -> list[str]:
        return await self.client.task_ids(env, split)  # type: ignore[arg-type]

    async def reference_episode(self, env: str, task_id: str) -> list[ChatMessage]:
        """A train task solved by the environment's reference (the warm start's `source: environment`)."""
        return await self.client.reference_episode(env, task_id)

    def outage_counters(self) -> OutageCounters:
        return self.client.outage_counters

    async def aclose(self) -> None:
        await self.client.aclose()


def shown_ids(trajectory: Trajectory) -> list[str]:
    """The experiences a rollout was shown: injected at its group's start (when flagged), else answered to its
    asks or retrieved at its steps (`trainer.asks.retrieved_ids`); [] for a rollout shown none."""
    if trajectory.experience_flag:
        return list(trajectory.experience_ids)
    return retrieved_ids(trajectory)


@dataclass
class Retrieved:
    """What one retrieval gives a rollout: the rendered text, the experience ids, and the demonstration
    (chat messages of a solved task) of the best-ranked hit that has one, with that hit's id and task kind."""

    text: str
    ids: list[str]
    demonstration: list[dict[str, Any]] | None = None
    demonstration_id: str | None = None
    demonstration_kind: str | None = None


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
    queued_deliveries: int = 0  # summarize/feedback calls that waited for the manager to come back
    delivered_late: int = 0
    # A step re-run after a resume whose earlier attempt was already delivered (same request id, new rollouts).
    already_delivered: int = 0
    ask_searches: int = 0  # experience.mode action/step: searches by asks or before steps
    ask_hits: int = 0  # ... that returned at least one experience
    ask_feedback_items: int = 0  # feedback items of rollouts shown experience by asks or step retrievals


@dataclass
class Pending:
    """A summarize or feedback call the experience manager has not acknowledged yet."""

    kind: str  # summarize | feedback
    request_id: str
    send: Callable[[ExperienceClient], Awaitable[None]] = field(repr=False)


class ExperiencePeer:
    """Retrieval for the agent loop (`ExperienceSource`) and the after-step feedback."""

    def __init__(self, base_url: str, workspace: str, *, top_k: int | None = None,
                 min_similarity: float | None = None, summarize_mode: str | None = None,
                 timeout: float = 300.0, outage: OutagePolicy | None = None) -> None:
        outage = outage or OutagePolicy()
        self.client = ExperienceClient(base_url, timeout=timeout, **outage.client_options("experience_manager"))
        # After-step deliveries do not hold up training while the manager restarts: one quick try,
        # else they wait in `pending` for the next step (or the end of the run, with the full budget).
        self.delivery = ExperienceClient(base_url, timeout=timeout, retries=1,
                                         **outage.client_options("experience_manager", budget_s=0))
        self.workspace, self.top_k, self.min_similarity = workspace, top_k, min_similarity
        self.summarize_mode = summarize_mode
        self.counters = ExperienceCounters()
        self.pending: list[Pending] = []

    async def start(self) -> None:
        await self.client.create_workspace(self.workspace)  # PUT: idempotent

    async def retrieve(self, query: str, task_kind: str | None = None) -> Retrieved | None:
        """`task_kind`: the task's kind when known (`metadata.task_kind`); the pool ranks its own kind first."""
        got = await self.client.retrieve(self.workspace, query, top_k=self.top_k,
                                         min_similarity=self.min_similarity, task_kind=task_kind)
        self.counters.retrievals += 1
        if not got.experience_ids or not got.rendered.strip():
            return None
        self.counters.hits += 1
        shown = next((e for e in got.experiences if e.demonstration), None)
        if shown is None:
            return Retrieved(got.rendered, list(got.experience_ids))
        return Retrieved(got.rendered, list(got.experience_ids), shown.demonstration, shown.experience_id,
                         shown.task_kind)

    async def search(self, query: str, task_kind: str | None = None) -> list[Hit]:
        """An ask's (or a step's) search of the pool (`trainer.asks.AskSource`): the hits with their scores."""
        got = await self.client.retrieve(self.workspace, query, top_k=self.top_k,
                                         min_similarity=self.min_similarity, task_kind=task_kind)
        self.counters.ask_searches += 1
        self.counters.ask_hits += bool(got.experiences)
        return [Hit(e.experience_id, float(e.score), f"{e.when_to_use.strip()} {e.content.strip()}")
                for e in got.experiences]

    async def source_task_ids(self) -> set[str]:
        """The task ids every experience of the pool (archived ones included) was distilled from."""
        ids: set[str] = set()
        offset, page = 0, 1000
        while True:
            experiences = await self.client.list_experiences(self.workspace, status="all", offset=offset, limit=page)
            for e in experiences:
                ids.update(e.provenance.task_ids)
            if len(experiences) < page:
                return ids
            offset += page

    async def after_step(self, groups: list[list[Trajectory]], *, summarize: bool, feedback: bool,
                         request_id: str) -> None:
        """Summarize the step's trajectories; report each rollout that was shown experience (injected at the
        group's start, answered to its asks, or retrieved at its steps) against its group's rollouts shown
        none (the baseline the experience manager scores advantage with)."""
        await self.deliver_pending()
        trajectories = [t for g in groups for t in g]
        self.counters.injected_rollouts += sum(t.experience_flag for t in trajectories)
        if feedback:
            items = []
            for group in groups:
                shown = [shown_ids(t) for t in group]
                plain = [float(t.outcome or 0.0) for t, ids in zip(group, shown, strict=True) if not ids]
                baseline = sum(plain) / len(plain) if plain else None
                for t, ids in zip(group, shown, strict=True):
                    if ids:
                        reward = float(t.outcome or 0.0)
                        items.append(FeedbackItem(experience_ids=ids, reward=reward, success=reward >= 1.0,
                                                  baseline=baseline))
                        self.counters.ask_feedback_items += not t.experience_flag
            if items:
                await self._deliver(Pending("feedback", f"{request_id}-feedback", self._feedback_sender(
                    items, f"{request_id}-feedback")))
        if summarize and trajectories:
            await self._deliver(Pending("summarize", f"{request_id}-summarize", self._summarize_sender(
                trajectories, f"{request_id}-summarize")))

    def _feedback_sender(self, items: list[FeedbackItem], request_id: str) -> Callable[[ExperienceClient],
                                                                                      Awaitable[None]]:
        async def send(client: ExperienceClient) -> None:
            await client.feedback(self.workspace, items, request_id=request_id)
            self.counters.feedback_items += len(items)
            self.counters.feedback_with_baseline += sum(i.baseline is not None for i in items)
        return send

    def _summarize_sender(self, trajectories: list[Trajectory], request_id: str) -> Callable[[ExperienceClient],
                                                                                           Awaitable[None]]:
        async def send(client: ExperienceClient) -> None:
            result = await client.summarize(self.workspace, trajectories, mode=self.summarize_mode,  # type: ignore[arg-type]
                                            request_id=request_id)
            self.counters.summarized_trajectories += len(trajectories)
            self.counters.experiences_created += len(result.created)
            self.counters.experiences_updated += len(result.updated)
        return send

    async def _deliver(self, item: Pending) -> None:
        try:
            await item.send(self.delivery)
        except ServiceCallError as exc:
            if exc.code == "request_id_conflict":
                # The run was killed after this step's delivery and before its checkpoint; the resumed run
                # re-sampled the step. The pool already holds that step once: applying it twice is what the
                # request id prevents.
                self.counters.already_delivered += 1
                logger.info("{} {} was delivered before the resume; the re-run step is not sent again", item.kind,
                            item.request_id)
                return
            if not is_outage(exc):
                raise
            self.pending.append(item)
            self.counters.queued_deliveries += 1
            logger.warning("experience manager unreachable: {} {} queued ({} waiting) until it is back",
                           item.kind, item.request_id, len(self.pending))

    async def deliver_pending(self, *, wait: bool = False) -> None:
        """Send what is queued, oldest first; `wait` rides out an outage with the full budget (end of run)."""
        while self.pending:
            item = self.pending[0]
            try:
                await item.send(self.client if wait else self.delivery)
            except ServiceCallError as exc:
                if not wait and is_outage(exc):
                    return
                raise
            self.pending.pop(0)
            self.counters.delivered_late += 1
            logger.info("delivered queued {} {} to the experience manager", item.kind, item.request_id)

    async def stats(self) -> dict[str, Any]:
        return await self.client.stats(self.workspace)

    def summary(self) -> dict[str, Any]:
        c = self.counters
        return {**asdict(c), "hit_rate": c.hits / c.retrievals if c.retrievals else 0.0}

    def outage_counters(self) -> OutageCounters:
        return merged_counters(self.client, self.delivery)

    def degradations(self) -> list[str]:
        c = self.counters
        if not c.queued_deliveries:
            return []
        return [f"experience manager: {c.queued_deliveries} summarize/feedback deliveries queued while it was "
                f"down, {c.delivered_late} delivered later, {len(self.pending)} undelivered"]

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.delivery.aclose()


@dataclass
class TaskCounters:
    batches: int = 0
    tasks_sampled: int = 0
    synthetic_sampled: int = 0
    synthetic_graded: int = 0
    synthetic_reward_sum: float = 0.0
    feedback_tasks: int = 0
    feedback_uncertain: int = 0  # pass-rate reports cut off mid-call by the task manager dying (not re-sent)


class TaskPeer:
    """Training batches from the task manager and grading of its synthetic tasks (`SyntheticGrader`)."""

    def __init__(self, base_url: str, *, synthetic_ratio: float | None = None, timeout: float = 120.0,
                 outage: OutagePolicy | None = None) -> None:
        self.client = TaskClient(base_url, timeout=timeout, **(outage or OutagePolicy()).client_options("task_manager"))
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

    async def feedback(self, trajectories: list[Trajectory], env: str, request_id: str | None = None) -> None:
        outcomes: dict[str, list[float]] = defaultdict(list)
        for t in trajectories:
            outcomes[t.task_id].append(float(t.outcome or 0.0))
        if not outcomes:
            return
        try:
            self.counters.feedback_tasks += await self.client.feedback(dict(outcomes), env_type=env,
                                                                       request_id=request_id)
        except PeerUnavailable:
            raise
        except ServiceCallError as exc:
            # The connection dropped mid-call and the report carries no request id (with one, the client
            # sends it again and the task manager applies it once): it may have been applied, so it is
            # not re-sent. The curriculum misses (or has) one step's pass rates.
            if exc.code != "unreachable":
                raise
            self.counters.feedback_uncertain += 1
            logger.warning("task manager went away during pass-rate feedback ({}); not sent again", exc)

    async def stats(self) -> dict[str, Any]:
        return await self.client.stats()

    def summary(self) -> dict[str, Any]:
        return asdict(self.counters)

    def outage_counters(self) -> OutageCounters:
        return self.client.outage_counters

    def degradations(self) -> list[str]:
        n = self.counters.feedback_uncertain
        return [f"task manager: {n} step(s) of pass-rate feedback cut off mid-call (maybe applied, not re-sent)"] \
            if n else []

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
    unreachable_batches: int = 0  # batches labelled by the outcome's sign because the judge was down
    unreachable_trajectories: int = 0
    # step labels by who gave them: rule (reference rule), llm+reference, llm, outcome (no labeller reached)
    labels_by_source: dict[str, int] = field(default_factory=dict)


class JudgePeer:
    """GOOD/BAD step labels for every rollout of a step, returned by trajectory id."""

    def __init__(self, base_url: str, *, timeout: float = 900.0, outage: OutagePolicy | None = None,
                 success_threshold: float = 0.5) -> None:
        outage = outage or OutagePolicy()
        self.client = JudgeClient(base_url, timeout=timeout, **outage.client_options(
            "judge", budget_s=min(outage.budget_s, outage.judge_fallback_after_s)))
        self.counters = JudgeCounters()
        self.success_threshold = success_threshold  # the judge service's default: an outcome above it is success

    async def label(self, trajectories: list[Trajectory]) -> dict[str, TrajectoryJudgment]:
        """The judgment (K labels, source, fallback) of each trajectory with steps, by trajectory id; the
        trajectories are left as they are."""
        # A rollout cut off before its first step (its prompt filled the context) has nothing to label,
        # and the judge refuses it: send only the others.
        trajectories = [t for t in trajectories if t.steps]
        if not trajectories:
            return {}
        try:
            response = await self.client.judge_trajectories(trajectories)
        except PeerUnavailable as exc:
            return self._outcome_sign(trajectories, str(exc))
        judgments = judgments_by_id(trajectories, response)
        self._count(response.judgments)
        return judgments

    def _count(self, judgments: Sequence[TrajectoryJudgment]) -> None:
        c = self.counters
        c.batches += 1
        c.trajectories += len(judgments)
        for judgment in judgments:
            c.steps_labelled += len(judgment.labels)
            c.good += sum(label.label == "GOOD" for label in judgment.labels)
            c.bad += sum(label.label == "BAD" for label in judgment.labels)
            c.fallbacks += int(judgment.fallback)
            c.parsed_labels += judgment.parsed_labels
            c.filled_steps += len(judgment.filled_steps)
            c.labels_by_source[judgment.source] = c.labels_by_source.get(judgment.source, 0) + len(judgment.labels)

    def _outcome_sign(self, trajectories: list[Trajectory], why: str) -> dict[str, TrajectoryJudgment]:
        """The judge stayed down: every step gets the outcome's sign, flagged like the judge's own fallback."""
        logger.warning("judge unavailable: labelling {} trajectories by their outcome's sign ({})",
                       len(trajectories), why)
        judgments = [TrajectoryJudgment(
            trajectory_id=t.trajectory_id, source="outcome", fallback=True,
            labels=fallback_labels(len(t.steps), float(t.outcome or 0.0) > self.success_threshold,
                                   "judge service unreachable")) for t in trajectories]
        self._count(judgments)
        self.counters.unreachable_batches += 1
        self.counters.unreachable_trajectories += len(trajectories)
        return {j.trajectory_id: j for j in judgments}

    def outage_counters(self) -> OutageCounters:
        return self.client.outage_counters

    def degradations(self) -> list[str]:
        c = self.counters
        if not c.unreachable_batches:
            return []
        return [f"judge: {c.unreachable_batches} batch(es), {c.unreachable_trajectories} trajectories "
                "labelled by the outcome's sign (counted in judge/fallbacks) while the judge was down"]

    async def stats(self) -> dict[str, Any]:
        return (await self.client.stats()).model_dump()

    def summary(self) -> dict[str, Any]:
        c = self.counters
        return {**asdict(c), "parse_rate": c.parsed_labels / c.steps_labelled if c.steps_labelled else 0.0,
                "fallback_rate": c.fallbacks / c.trajectories if c.trajectories else 0.0}

    async def aclose(self) -> None:
        await self.client.aclose()


def merged_counters(*clients: ServiceClient) -> OutageCounters:
    total = OutageCounters()
    for client in clients:
        for name, value in asdict(client.outage_counters).items():
            setattr(total, name, getattr(total, name) + value)
    return total
