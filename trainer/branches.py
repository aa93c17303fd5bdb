"""Paired branches: the credit of an ask (`trainer.experience.ask_reward: paired_branch`, ProactAgent's
paired-branch process reward).

For a sampled share of the rollouts that asked, the trainer continues the same prefix without the answer
and credits the first ask with the difference of the two outcomes:

    c = outcome(with the answer) - outcome(branch without it)     on the asking step (`step_credits`)

which the step-level estimators add to that step's reward (ADCA's r_{i,t}, GiGPO's step returns: see
their docstrings). The branch is `run_episode` again, around two wrappers and with the asks withheld:

- `ReplayedGenerate`: the recorded generations of the turns up to and including the first ask are given
  back as they were (no sampling), then the policy generates; every turn keeps its seed (`seed * 1000 + t`);
- `BranchEnv`: the environment at the state the ask saw, either a fork made at the ask (`fork`; the prefix's
  steps are answered from the record) or a fresh instance the prefix's actions are replayed on
  (`replay`, for deterministic environments; each observation must match the record);
- `AskPolicy(withhold=True)`: the ask (and any later one) is recorded and counted, and answered with a note
  that no experience is given.

The state is checked at the branch point: the environment's `state_hash` at the ask (read by `on_ask`) must
equal the branch's before it continues, else the branch is dropped and counted as a failure. Which rollouts
branch is decided after the step from each rollout's seed (seeded, deterministic); with `fork`, every first
ask is forked when it happens (a copy of a small state) and the forks of rollouts not sampled are released.

This module knows no backend: it takes a `generate` callable and the env access, like `run_episode`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import numpy as np
from loguru import logger

from common.schemas import ChatMessage, Step, Task, Trajectory
from env_service.protocol import CreateResponse, StepResponse
from trainer.asks import AskPolicy, is_ask
from trainer.policy import GenerateFn, Generation, Sampling
from trainer.rollout import EnvAccess, Rollout, SyntheticGrader, run_episode
from trainer.settings import RolloutConfig

BranchState = Literal["fork", "replay"]


class BranchUnsupported(ValueError):
    """The environment can neither fork nor replay: `ask_reward: paired_branch` cannot run on it."""


class BranchDiverged(RuntimeError):
    """The branch did not reach the state the ask saw (a replay that went elsewhere)."""


class BranchEnvPeer(EnvAccess, Protocol):
    async def fork(self, instance_id: str) -> str: ...
    async def state_hash(self, instance_id: str) -> str | None: ...


def branch_state(capabilities: Mapping[str, bool], preference: str, env: str) -> BranchState:
    """How branches reach the ask's state on environment `env`, from what it declares (`capabilities`) and
    `trainer.experience.branch_state` (auto: fork where it can, else replay)."""
    fork, deterministic = bool(capabilities.get("fork")), bool(capabilities.get("deterministic"))
    if preference == "fork" and not fork:
        raise BranchUnsupported(f"trainer.experience.branch_state=fork: environment {env!r} cannot fork its "
                                "instances (its capabilities do not declare fork); use branch_state: auto or replay")
    if preference == "replay" and not deterministic:
        raise BranchUnsupported(f"trainer.experience.branch_state=replay: environment {env!r} is not declared "
                                "deterministic (replaying its actions may reach another state); use branch_state: "
                                "auto or fork")
    if preference in ("fork", "replay"):
        return preference  # type: ignore[return-value]
    if fork:
        return "fork"
    if deterministic:
        return "replay"
    raise BranchUnsupported(f"trainer.experience.ask_reward=paired_branch needs an environment that forks its instances "
                            f"or is deterministic; environment {env!r} declares neither (its capabilities: fork false, "
                            "deterministic false). Set ask_reward: none, or declare a capability in the "
                            "environment (Environment.capabilities, EnvInstance.fork)")


def first_ask(trajectory: Trajectory) -> Step | None:
    """The episode's first ask within the budget: the step a branch credits."""
    return next((s for s in trajectory.steps if is_ask(s) and not s.info["ask"].get("over_budget")), None)


def sampled(rollout: Rollout, share: float, seed: int) -> bool:
    """Whether an asking rollout gets a branch: a share `share` of them, decided by a hash of the run's seed,
    the task and the rollout's own seed (so the same run samples the same rollouts)."""
    if share >= 1.0:
        return True
    digest = hashlib.sha256(f"{seed}:{rollout.trajectory.task_id}:{rollout.seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def step_credits(trajectory: Trajectory) -> list[float] | None:
    """The trajectory's K step credits: on an ask credited by its branch, the outcome difference; else 0.
    None when no step of it was credited (the estimators then see no credits for the row)."""
    credited = False
    credits = []
    for step in trajectory.steps:
        branch = step.info["ask"].get("branch") if is_ask(step) else None
        credited |= branch is not None
        credits.append(float(branch["difference"]) if branch is not None else 0.0)
    return credits if credited else None


class ReplayedGenerate:
    """A `generate` that gives back `recorded` for the first turns, then samples from `generate`."""

    def __init__(self, generate: GenerateFn, recorded: Sequence[Generation]) -> None:
        self.generate, self.recorded = generate, list(recorded)
        self.turn = 0
        self.generated_tokens = 0  # sampled by the policy (the replayed turns are not)

    async def __call__(self, prompt_ids: list[int], sampling: Sampling) -> Generation:
        turn, self.turn = self.turn, self.turn + 1
        if turn < len(self.recorded):
            return self.recorded[turn]
        out = await self.generate(prompt_ids, sampling)
        self.generated_tokens += len(out.token_ids)
        return out


@dataclass
class BranchPoint:
    """What an episode's first ask left for its branch: the turn, the environment's state hash there, and the
    fork made there (`fork` branches)."""

    turn: int
    state_hash: str | None = None
    fork_id: str | None = None
    error: str | None = None  # reading the state or forking failed at the ask: this rollout cannot branch


class BranchPoints:
    """The branch points of one step's rollouts, by environment instance id: `on_ask` is the `AskPolicy` hook
    of the step's collection."""

    def __init__(self, env: BranchEnvPeer, state: BranchState, active: bool = True) -> None:
        self.env, self.state, self.active = env, state, active
        self.points: dict[str, BranchPoint] = {}
        self.forks = 0

    async def on_ask(self, instance_id: str, turn: int) -> None:
        if not self.active or instance_id in self.points:  # only the first ask of an episode branches
            return
        point = self.points[instance_id] = BranchPoint(turn)
        try:
            point.state_hash = await self.env.state_hash(instance_id)
            if self.state == "fork":
                point.fork_id = await self.env.fork(instance_id)
                self.forks += 1
        except Exception as exc:  # the episode goes on; only its branch is lost (a failure if it is sampled)
            point.error = f"{type(exc).__name__}: {exc}"
            logger.warning("branch point of {} at turn {} failed: {}", instance_id, turn, point.error)

    async def release_forks(self) -> None:
        """Release every fork of the step: those no branch ran on, and any a failed branch left (releasing one a
        branch released already is harmless)."""
        unused = [p.fork_id for p in self.points.values() if p.fork_id]
        results = await asyncio.gather(*(self.env.release(f) for f in unused), return_exceptions=True)
        for fork_id, result in zip(unused, results, strict=True):
            if isinstance(result, BaseException):  # env_service reaps it after its idle TTL
                logger.warning("release of branch fork {} failed: {}", fork_id, result)


class BranchEnv:
    """The env access of one branch: the ask's state through the fork made there, or by replaying the prefix's
    actions on a fresh instance; the state hash at the branch point must equal the one the ask saw."""

    def __init__(self, env: BranchEnvPeer, rollout: Rollout, ask: Step, point: BranchPoint,
                 state: BranchState) -> None:
        self.env, self.point, self.state = env, point, state
        self.opening = rollout.trajectory.messages[:2]  # [system, user]: what create answered the original
        self.prefix = [s for s in rollout.trajectory.steps if s.index < ask.index]  # environment steps only
        self.calls = 0
        self.state_hash_at_branch: str | None = None

    async def create(self, env: str, task: Task) -> Any:
        if self.state == "fork":
            assert self.point.fork_id is not None
            created = CreateResponse(instance_id=self.point.fork_id, env=env, task_id=task.env_task_id,
                                     messages=self.opening)
        else:
            created = await self.env.create(env, task)
            if [m.text() for m in created.messages] != [m.text() for m in self.opening]:
                await self.env.release(created.instance_id)
                raise BranchDiverged("a fresh instance of the task opened with other messages than the original")
        if not self.prefix:  # the ask was the first turn: the fresh instance (or the fork) is the branch point
            try:
                await self._check_branch_point(created.instance_id)
            except BaseException:
                await self.env.release(created.instance_id)  # run_episode releases only what create returned
                raise
        return created

    async def step(self, instance_id: str, action: str) -> Any:
        index, self.calls = self.calls, self.calls + 1
        if index >= len(self.prefix):
            return await self.env.step(instance_id, action)
        recorded = self.prefix[index]
        if self.state == "fork":  # the fork is past these steps already
            result = StepResponse(observation=recorded.observation or ChatMessage(role="user", content=""),
                                  reward=recorded.reward, done=recorded.done,
                                  info={k: v for k, v in recorded.info.items() if k != "finish_reason"})
        else:
            result = await self.env.step(instance_id, action)
            seen = recorded.observation.text() if recorded.observation is not None else ""
            if result.observation.text() != seen:
                raise BranchDiverged(f"replaying step {recorded.index} gave another observation than the original")
        if index == len(self.prefix) - 1:
            await self._check_branch_point(instance_id)
        return result

    async def _check_branch_point(self, instance_id: str) -> None:
        self.state_hash_at_branch = await self.env.state_hash(instance_id)
        if self.state_hash_at_branch != self.point.state_hash:
            raise BranchDiverged(f"the branch reached state {self.state_hash_at_branch} where the ask saw "
                                 f"{self.point.state_hash}")

    async def evaluate(self, instance_id: str, params: dict[str, Any] | None = None) -> Any:
        return await self.env.evaluate(instance_id, params)

    async def state(self, instance_id: str) -> dict[str, Any] | None:
        return await self.env.state(instance_id)

    async def release(self, instance_id: str) -> bool:
        return await self.env.release(instance_id)


@dataclass
class Branch:
    """One finished branch: the outcomes with and without the answer, and what it cost."""

    trajectory_id: str
    ask_step: int
    outcome_with: float
    outcome_without: float
    seconds: float
    generated_tokens: int
    state: BranchState
    state_hash_at_ask: str | None
    state_hash_at_branch: str | None
    trajectory: Trajectory = field(repr=False)  # the branch's own episode (not trained on)

    @property
    def difference(self) -> float:
        return self.outcome_with - self.outcome_without


@dataclass
class BranchCounters:
    """The run's paired branches, for the summary (and its checkpoint)."""

    branches: int = 0  # branches that reached an outcome: their difference credited the ask
    failures: int = 0  # branches that failed (an environment error, a replay that diverged): no credit
    seconds: float = 0.0  # wall time of the steps' branch phases
    difference_sum: float = 0.0
    positive: int = 0  # branches whose difference was > 0: the answer helped
    forks: int = 0  # forks made at first asks (those of rollouts not sampled were released unused)
    generated_tokens: int = 0

    def summary(self) -> dict[str, Any]:
        """The run's totals as the summary's `self_navigating` counters (`branches`, `branch_*`)."""
        n = self.branches
        return {"branches": n, "branch_failures": self.failures, "branch_seconds": round(self.seconds, 3),
                "branch_forks": self.forks, "branch_generated_tokens": self.generated_tokens,
                "branch_difference_mean": self.difference_sum / n if n else None,
                "branch_positive_share": self.positive / n if n else None}


class BranchRunner:
    """Runs a step's paired branches and writes each difference onto the asking step
    (`info["ask"]["branch"]`), where `step_credits` reads it."""

    def __init__(self, env: BranchEnvPeer, generate: GenerateFn, tokenizer: Any, config: RolloutConfig,
                 asks: AskPolicy, *, state: BranchState, share: float, seed: int,
                 grader: SyntheticGrader | None = None) -> None:
        self.env, self.generate, self.tokenizer, self.config = env, generate, tokenizer, config
        self.withheld = replace(asks, withhold=True, on_ask=None)
        self.state, self.share, self.seed, self.grader = state, share, seed, grader
        self.counters = BranchCounters()

    def points(self) -> BranchPoints:
        """A fresh registry for one step's collection; its `on_ask` goes into that collection's `AskPolicy`."""
        return BranchPoints(self.env, self.state, active=self.share > 0)

    async def run(self, groups: Sequence[Sequence[Rollout]], tasks: Mapping[str, Task],
                  points: BranchPoints) -> dict[str, float]:
        """Branch the sampled asking rollouts of `groups` (`tasks`: each rollout's Task by task id); returns the
        step's metrics (`experience/branch_*`)."""
        started = time.monotonic()
        chosen = [(r, points.points[r.instance_id]) for g in groups for r in g
                  if r.instance_id in points.points and r.seed is not None and first_ask(r.trajectory) is not None
                  and sampled(r, self.share, self.seed)]
        limit = asyncio.Semaphore(self.config.concurrency)

        async def one(rollout: Rollout, point: BranchPoint) -> Branch | BaseException:
            async with limit:
                try:
                    return await self.branch(rollout, tasks[rollout.trajectory.task_id], point)
                except Exception as exc:  # a failed branch costs its credit, never the step
                    logger.warning("paired branch of {} failed: {}", rollout.trajectory.task_id, exc)
                    return exc

        try:
            results = await asyncio.gather(*(one(r, p) for r, p in chosen))
        finally:
            await points.release_forks()
        branches = [b for b in results if isinstance(b, Branch)]
        for (rollout, _), branch in zip(chosen, results, strict=True):
            if isinstance(branch, Branch):
                ask = first_ask(rollout.trajectory)
                assert ask is not None
                ask.info["ask"]["branch"] = {"outcome_without": branch.outcome_without,
                                             "difference": branch.difference, "state": branch.state,
                                             "seconds": round(branch.seconds, 3)}
        seconds = time.monotonic() - started
        c = self.counters
        c.branches += len(branches)
        c.failures += len(results) - len(branches)
        c.seconds += seconds
        c.difference_sum += sum(b.difference for b in branches)
        c.positive += sum(b.difference > 0 for b in branches)
        c.forks += points.forks
        c.generated_tokens += sum(b.generated_tokens for b in branches)
        metrics = {"experience/branches": float(len(branches)),
                   "experience/branch_failures": float(len(results) - len(branches)),
                   "experience/branch_s": seconds, "experience/branch_forks": float(points.forks),
                   "experience/branch_generated_tokens": float(sum(b.generated_tokens for b in branches))}
        if branches:
            differences = [b.difference for b in branches]
            metrics["experience/branch_difference_mean"] = float(np.mean(differences))
            metrics["experience/branch_positive_share"] = float(np.mean([d > 0 for d in differences]))
        return metrics

    async def branch(self, rollout: Rollout, task: Task, point: BranchPoint) -> Branch:
        """The rollout's branch without the answer to its first ask (see the module docstring)."""
        started = time.monotonic()
        if point.error is not None:
            raise BranchDiverged(f"no branch point: {point.error}")
        ask = first_ask(rollout.trajectory)
        if ask is None or ask.index != point.turn:
            raise BranchDiverged(f"the rollout's first ask is not at turn {point.turn}, where on_ask saw it")
        env = BranchEnv(self.env, rollout, ask, point, self.state)
        generate = ReplayedGenerate(self.generate, rollout.turn_generations[:ask.index + 1])
        episode = await run_episode(task, env, generate, self.tokenizer, self.config, seed=rollout.seed,
                                    grader=self.grader, asks=self.withheld)
        replayed = episode.trajectory.steps[ask.index] if len(episode.trajectory.steps) > ask.index else None
        if replayed is None or not is_ask(replayed) or not replayed.info["ask"]["withheld"]:
            raise BranchDiverged("the replayed prefix did not reach the ask")
        return Branch(rollout.trajectory.trajectory_id, ask.index, float(rollout.trajectory.outcome or 0.0),
                      float(episode.trajectory.outcome or 0.0), time.monotonic() - started, generate.generated_tokens,
                      self.state, point.state_hash, env.state_hash_at_branch, episode.trajectory)
