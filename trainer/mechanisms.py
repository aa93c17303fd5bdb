"""The mechanisms layer: what a training step asks of the task manager, the experience manager and the
judge, written once and called by both backends (`trainer.local.LocalTrainer` and the veRL plugin).

One step, in order:
1. tasks: `next_tasks` -- a batch from the task manager (original and synthetic tasks by its mixture and
   curriculum), seeded by the step; None when no task manager is configured (the caller walks the
   environment's own tasks);
2. experience: a `GroupExperience` per task group -- one retrieval per group, shared by the group's
   flagged rollouts; which rollouts are flagged is `experience_flags` (the first round(n * eta));
3. judge: `label` -- GOOD/BAD step labels for the whole batch in one call, returned by trajectory id,
   only when the estimator declares `step_labels` among its needs (the estimator catalog says so);
4. feedback: `after_step` -- the step's trajectories summarized into the pool, usage feedback for every
   experience-given rollout against its group's no-experience baseline, pass rates to the curriculum.

The experience bit is `experience_flag` everywhere (trajectory field, veRL extra field, loss input).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Coroutine, Sequence
from typing import Any, Literal, Protocol, TypeVar

from common.schemas import Task, Trajectory
from estimators import catalog
from judge.client import TrajectoryJudgment
from trainer.config import ExperienceConfig, TaskSourceConfig
from trainer.peers import ExperiencePeer, JudgePeer, OutagePolicy, Retrieved, TaskPeer

T = TypeVar("T")


def step_batch_seed(seed: int, step: int) -> int:
    """The seed of a step's task batch (0-based step): both backends ask the task manager with it."""
    return seed * 100_003 + step


def experience_flags(n: int, experience_ratio: float) -> list[bool]:
    """The flag rule: of a group's n rollouts, the first round(n * eta) are given experience."""
    flagged = round(n * experience_ratio)
    return [i < flagged for i in range(n)]


InjectMode = Literal["text", "turns"]


class ExperienceSource(Protocol):
    async def retrieve(self, query: str, task_kind: str | None = None) -> Retrieved | tuple[str, list[str]] | None:
        """Experience for a task query: text and ids (and a demonstration when there is one, preferably of
        `task_kind`, the task's kind when known), None when nothing is relevant."""


class GroupExperience:
    """One retrieval per task group, done by the first flagged rollout that knows the query; the
    group's other flagged rollouts get the same experience, injected the way `inject` says."""

    def __init__(self, source: ExperienceSource, inject: InjectMode = "text",
                 demonstration_observation_tokens: int = 96) -> None:
        self.source = source
        self.inject = inject
        self.demonstration_observation_tokens = demonstration_observation_tokens
        self.retrievals = 0
        self.turns_injected = 0  # rollouts given the demonstration as chat turns (whole or shortened)
        self.text_fallbacks = 0  # `turns` rollouts given text because no hit had a demonstration
        self.demos_shortened = 0  # demonstrations shown with their observations cut to fit the context
        self.demos_dropped = 0  # demonstrations that did not fit even cut: the rollout went without
        # Rollouts shown a demonstration where both kinds are known (the task's and the demonstration's), and
        # those of them shown one of the task's own kind.
        self.demos_kind_known = 0
        self.demos_same_kind = 0
        self._lock = asyncio.Lock()
        self._done = False
        self._value: Retrieved | None = None

    async def get(self, query: str, task_kind: str | None = None) -> Retrieved | None:
        async with self._lock:
            if not self._done:
                got = await (self.source.retrieve(query, task_kind) if task_kind else self.source.retrieve(query))
                self._value = Retrieved(got[0], list(got[1])) if isinstance(got, tuple) else got
                self.retrievals += 1
                self._done = True
            return self._value

    def demonstration_for(self, got: Retrieved) -> list[dict[str, Any]] | None:
        """The demonstration a rollout is given as turns (None: inject the text); a missing one is counted."""
        if self.inject != "turns":
            return None
        if got.demonstration:
            return got.demonstration
        self.text_fallbacks += 1
        return None

    def record_fit(self, fit: str | None) -> None:
        """Count how a demonstration fitted the context (`ContextTemplate.demonstration_fit`)."""
        self.turns_injected += fit in ("whole", "shortened")
        self.demos_shortened += fit == "shortened"
        self.demos_dropped += fit == "dropped"

    def record_kind(self, task_kind: str | None, demonstration_kind: str | None) -> None:
        """Count a shown demonstration against the task's kind (only where both are known)."""
        if task_kind and demonstration_kind:
            self.demos_kind_known += 1
            self.demos_same_kind += task_kind == demonstration_kind


class Mechanisms:
    """The three self-evolving mechanisms behind one object; each peer is optional (None: not configured)."""

    def __init__(self, *, estimator: str, experience_ratio: float = 0.0, task_url: str | None = None,
                 experience_url: str | None = None, judge_url: str | None = None,
                 experience: ExperienceConfig | None = None, tasks: TaskSourceConfig | None = None,
                 timeout: float = 120.0, outage: OutagePolicy | None = None) -> None:
        self.estimator = estimator
        self.needs = catalog.needs(estimator)
        self.experience_ratio = experience_ratio
        self.experience_config = experience or ExperienceConfig()
        self.task_config = tasks or TaskSourceConfig()
        exp = self.experience_config
        self.experience = ExperiencePeer(experience_url, exp.workspace, top_k=exp.top_k,
                                         min_similarity=exp.min_similarity,
                                         summarize_mode=exp.summarize_mode, outage=outage) if experience_url else None
        self.tasks = TaskPeer(task_url, synthetic_ratio=self.task_config.synthetic_ratio,
                              timeout=timeout, outage=outage) if task_url else None
        self.judge = JudgePeer(judge_url, outage=outage) if judge_url else None
        if self.needs_step_labels and self.judge is None:
            raise ValueError(f"advantage estimator {estimator!r} needs step labels: configure the judge service")

    @property
    def needs_step_labels(self) -> bool:
        return "step_labels" in self.needs

    async def start(self) -> None:
        if self.experience is not None:
            await self.experience.start()

    # ------------------------------------------------------------------ 1. tasks

    async def next_tasks(self, k: int, env: str, *, seed: int) -> list[Task] | None:
        """A batch from the task manager (a function of `seed` and its curriculum), or None without one."""
        if self.tasks is None:
            return None
        return await self.tasks.sample(k, env, seed=seed)

    # 2. experience: `experience_flags` and `GroupExperience` above, used by `trainer.rollout.collect_groups`
    #    and the veRL agent loop alike, with `self.experience` as the source.

    # ------------------------------------------------------------------ 3. judge

    async def label(self, trajectories: Sequence[Trajectory]) -> dict[str, TrajectoryJudgment] | None:
        """Step labels for the whole batch in one judge call, when the estimator needs them.

        Returns the judgment of each trajectory with steps, by trajectory id; None when the judge was not
        asked. The trajectories are left as they are: the caller puts the labels on its step batch."""
        if not trajectories or not self.needs_step_labels or self.judge is None:
            return None
        return await self.judge.label(list(trajectories))

    # ------------------------------------------------------------------ 4. feedback

    async def after_step(self, groups: Sequence[Sequence[Trajectory]], env: str, *, request_id: str) -> None:
        """Summaries and usage feedback to the experience manager, pass rates to the task manager.

        `request_id` ties the calls to (run, step): a resumed run re-sending a step is not applied twice."""
        exp = self.experience_config
        lists = [list(g) for g in groups]
        if self.experience is not None and (exp.summarize or exp.feedback):
            await self.experience.after_step(lists, summarize=exp.summarize, feedback=exp.feedback,
                                             request_id=request_id)
        if self.tasks is not None and self.task_config.feedback:
            await self.tasks.feedback([t for g in lists for t in g], env, request_id=request_id)

    # ------------------------------------------------------------------ bookkeeping

    def peers(self) -> dict[str, Any]:
        """The configured peers by metric prefix."""
        peers = {"experience": self.experience, "tasks": self.tasks, "judge": self.judge}
        return {name: peer for name, peer in peers.items() if peer is not None}

    def metrics(self) -> dict[str, float]:
        """Every peer's counters as flat metrics; a counter that is a mapping (labels by source) gives one metric
        per key (`judge/labels_by_source/rule`)."""
        out: dict[str, float] = {}
        for name, peer in self.peers().items():
            for key, value in peer.summary().items():
                if isinstance(value, dict):
                    out.update({f"{name}/{key}/{sub}": float(v) for sub, v in value.items()})
                else:
                    out[f"{name}/{key}"] = float(value)
        return out

    def counters(self) -> dict[str, dict[str, Any]]:
        return {name: dict(vars(peer.counters)) for name, peer in self.peers().items()}

    def load_counters(self, state: dict[str, dict[str, Any]]) -> None:
        for name, counters in state.items():
            peer = self.peers().get(name)
            if peer is not None:
                peer.counters = type(peer.counters)(**counters)

    async def aclose(self) -> None:
        for peer in self.peers().values():
            await peer.aclose()


def groups_of(trajectories: Sequence[Trajectory]) -> list[list[Trajectory]]:
    """Trajectories grouped by `group_id` (else `task_id`), groups and members in first-seen order."""
    by_key: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        by_key.setdefault(t.group_id or t.task_id, []).append(t)
    return list(by_key.values())


class LoopThread:
    """An event loop on a daemon thread, so synchronous code (veRL's trainer, its dataloader) can call
    the async mechanisms; the peers' HTTP clients live on this one loop for the whole run."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="evolver-mechanisms", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T] | Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
