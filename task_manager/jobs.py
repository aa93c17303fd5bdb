"""Explore/synthesize jobs: resumable, with progress, one committed episode at a time.

Episodes of a job are numbered; episode e explores with a generator seeded by (job seed, e), so a
redone episode explores the same way. Episodes run `concurrency` at a time (exploration, proposal
and verification are independent), then commit in order: dedup against everything stored, and
one transaction writes the exploration, the kept tasks and the job's cursor. A restart resumes
every unfinished job at its cursor. A test-only fault hook (EVOLVER_TM_FAULT, off by default)
kills the process at a chosen commit to prove it.
"""

from __future__ import annotations

import asyncio
import copy
import os
import random
import signal
import sqlite3
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loguru import logger

from common.faults import disk_full_message, is_disk_full
from common.schemas import Task
from task_manager.explore import (
    ExploreConfig,
    LLMExplorer,
    RandomExplorer,
    explore_episode,
    observed_exploration,
)
from task_manager.kinds import proposal_kind
from task_manager.lookups import LookupSynthesizer
from task_manager.models import Call, Exploration, Proposal, Reference, StoredTask, canonical_hash
from task_manager.multicall import MultiCallSynthesizer, observed_calls
from task_manager.protocol import Failures, JobRequest
from task_manager.synthesize import HindsightSynthesizer, LLMSynthesizer, SynthesisStats, signature
from task_manager.verify import verify

if TYPE_CHECKING:
    import numpy as np

    from common.llm import LLMClient
    from task_manager.dedup import DedupIndex
    from task_manager.envs import EnvAccess
    from task_manager.profile import EnvProfile
    from task_manager.settings import TaskManagerSettings
    from task_manager.store import TaskStore

DISK_FULL_RETRY_MAX_S = 30.0
FAULT_ENV = "EVOLVER_TM_FAULT"  # "<kill_before_commit|kill_inside_commit|kill_after_commit>:<episode>"


def new_progress(episodes: int) -> dict[str, Any]:
    return {"episodes_total": episodes, "episodes_done": 0, "episode_errors": 0, "steps": 0, "states_reached": 0,
            "proposed": 0, "parsed": 0, "verified": 0, "kept": 0, "rejected": {}, "dropped": {},
            "by_kind": {},  # task kind -> proposed, verified, kept; rejected, dropped, unmatched: {reason: count}
            "failures": Failures().model_dump()}  # episodes that gave no verified task, by reason


@dataclass
class EpisodeResult:
    episode: int
    exploration: Exploration | None = None
    stats: SynthesisStats = field(default_factory=SynthesisStats)
    verified: list[tuple[Proposal, Reference]] = field(default_factory=list)
    rejected: Counter = field(default_factory=Counter)
    proposed_kinds: Counter = field(default_factory=Counter)  # proposals by task kind
    rejected_kinds: Counter = field(default_factory=Counter)  # (task kind, reason) of proposals turned down
    unmatched_kinds: Counter = field(default_factory=Counter)  # (task kind, reason): observed runs not a task
    error: str | None = None
    failures: Failures = field(default_factory=Failures)

    def explain(self, kinds: list[str]) -> None:
        """Why this episode gave no verified task, when it gave none (`failures`)."""
        if self.verified:
            return
        exploration = self.exploration
        if self.error is not None:
            self.failures.add("episode_error", self.error)
        elif exploration is not None and exploration.environment_error is not None:
            self.failures.add("environment_error", exploration.environment_error)
        elif self.stats.proposed == 0:
            if "goal" in kinds and exploration is not None and exploration.states_reached == 0:
                self.failures.add("no_state_change")
            if "lookup" in kinds:
                self.failures.add("no_lookup_records")
            if not self.failures.by_reason:
                self.failures.add("nothing_proposed")
        else:
            self.failures.add("none_verified")


def _fault(stage: str, episode: int) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    if spec == f"{stage}:{episode}":
        logger.warning("fault injection: {} at episode {}: killing this process", stage, episode)
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class JobContext:
    """What a job reads and calls: the store, the environment, the settings, and the service's building
    blocks (the task manager passes its own methods)."""

    store: TaskStore
    access: EnvAccess
    settings: TaskManagerSettings
    llm: Callable[[str], LLMClient]  # the client of an LLM role: explorer, synthesizer
    roles: Callable[[JobRequest], tuple[str, str]]  # the explorer and synthesizer kinds a job uses
    explore_config: Callable[[JobRequest], ExploreConfig]
    profile: Callable[[str], Awaitable[EnvProfile]]
    dedup_index: Callable[[str], Awaitable[DedupIndex]]
    asked_kinds: Callable[[str], Awaitable[dict[tuple[str, str], int]]]
    recent_queries: Callable[[str], list[str]]
    embed: Callable[[list[str]], Awaitable[list[np.ndarray] | None]]
    tasks_changed: Callable[[str], None]  # an environment's stored tasks changed


class JobRunner:
    def __init__(self, context: JobContext) -> None:
        self.context = context
        self.tasks: dict[str, asyncio.Task] = {}
        self._cancelled: set[str] = set()

    def start(self, job_id: str) -> None:
        if job_id in self.tasks and not self.tasks[job_id].done():
            return
        self.tasks[job_id] = asyncio.create_task(self._guarded(job_id), name=f"job-{job_id}")

    def cancel(self, job_id: str) -> None:
        self._cancelled.add(job_id)

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    async def _guarded(self, job_id: str) -> None:
        store = self.context.store
        try:
            await self.run(job_id)
        except asyncio.CancelledError:
            raise  # shutdown: the job stays "running" and resumes on the next start
        except Exception as exc:
            logger.exception("job {} failed", job_id)
            store.set_job(job_id, status="failed", error=f"{type(exc).__name__}: {exc}")

    async def run(self, job_id: str) -> None:
        context, store = self.context, self.context.store
        job = store.job(job_id)
        if job is None:
            return
        request = JobRequest.model_validate(job["params"])
        progress, cursor = job["progress"], job["cursor"]
        store.set_job(job_id, status="running")
        seeds = ([o.seed_task_id for o in request.observed] if request.observed is not None
                 else request.seed_tasks or await context.access.task_ids(request.env, "train"))
        if not seeds:
            raise ValueError(f"environment {request.env!r} has no train tasks to explore from; pass seed_tasks")
        config = context.explore_config(request)
        profile = await context.profile(request.env)
        explorer_kind, synthesizer_kind = context.roles(request)
        synthesizes = _synthesizes(request)
        if synthesizes:
            _check_kinds(request.env, context.settings.synthesis.kinds, profile)
        index = await context.dedup_index(request.env) if synthesizes else None
        synthesis = context.settings.synthesis
        if synthesizes and synthesis.lookup_kinds == "train":
            # What the environment's train tasks ask, by kind and form, of what the job writes (only those).
            asked = await context.asked_kinds(request.env)
            progress["asked_kinds"] = {f"{kind}/{form}": asked[(kind, form)] for what in synthesis.kinds
                                       for kind, form in _asked_of(profile, asked, what)}
        logger.info("job {}: {} on {} from episode {} of {} (explorer {}, synthesizer {})", job_id, request.kind,
                    request.env, cursor, request.episodes, explorer_kind,
                    synthesizer_kind if synthesizes else "-")
        concurrency = context.settings.explore.concurrency
        failures_in_a_row = 0
        while cursor < request.episodes:
            if job_id in self._cancelled:
                store.set_job(job_id, status="cancelled")
                return
            chunk = range(cursor, min(cursor + concurrency, request.episodes))
            results = await asyncio.gather(*(self._episode(job_id, request, e, seeds, config, profile,
                                                           explorer_kind, synthesizer_kind) for e in chunk))
            for result in results:
                failures_in_a_row = failures_in_a_row + 1 if result.error else 0
                await self._commit_when_writable(job_id, request, result, progress, index)
                cursor = result.episode + 1
            if failures_in_a_row >= 3:
                raise RuntimeError(f"{failures_in_a_row} episodes in a row failed; last: {results[-1].error}")
        found_nothing = _found_nothing(request, progress)
        if found_nothing:
            logger.error("job {} on {}: {}", job_id, request.env, found_nothing)
            store.set_job(job_id, status="failed", error=found_nothing)
            return
        store.set_job(job_id, status="done")
        logger.info("job {} done: {} episodes, proposed {}, verified {}, kept {}", job_id, progress["episodes_done"],
                    progress["proposed"], progress["verified"], progress["kept"])

    async def _episode(self, job_id: str, request: JobRequest, episode: int, seeds: list[str], config: ExploreConfig,
                       profile: Any, explorer_kind: str, synthesizer_kind: str) -> EpisodeResult:
        context = self.context
        result = EpisodeResult(episode)
        rng = random.Random(f"{request.seed}:{episode}")
        seed_task = seeds[episode % len(seeds)]
        try:
            if request.observed is not None:
                observed = request.observed[episode]
                exploration = await observed_exploration(
                    context.access, profile, request.env, seed_task,
                    [Call(name=c.name, arguments=c.arguments) for c in observed.calls], [c.result for c in observed.calls])
            else:
                explorer = (LLMExplorer(context.llm("explorer"), context.settings.explore.max_tokens)
                            if explorer_kind == "llm" else RandomExplorer(rng))
                exploration = await explore_episode(context.access, explorer, profile, request.env, seed_task, config)
            exploration.job_id, exploration.episode = job_id, episode
            exploration.exploration_id = f"expl-{canonical_hash([job_id, episode])}"
            result.exploration = exploration
            if not _synthesizes(request):
                return result
            synthesis = context.settings.synthesis
            proposals: list[Proposal] = []
            if "goal" in synthesis.kinds and synthesizer_kind == "llm":
                synthesizer = LLMSynthesizer(context.llm("synthesizer"), profile, synthesis.max_tokens,
                                             synthesis.temperature, synthesis.min_confidence)
                tools = await context.access.tool_docs(request.env, seed_task)
                proposals, result.stats = await synthesizer.propose(exploration, context.recent_queries(request.env),
                                                                    tools)
            elif "goal" in synthesis.kinds:
                hindsight = HindsightSynthesizer(context.access, profile, synthesis.max_goals, synthesis.max_repairs,
                                                 tuple(synthesis.query_forms))
                proposals, result.stats = await hindsight.propose(exploration)
            asked = None
            if synthesis.lookup_kinds == "train" and {"lookup", "multicall"} & set(synthesis.kinds):
                asked = await context.asked_kinds(request.env)
            if "lookup" in synthesis.kinds:
                lookup_asked = None if asked is None else _asked_of(profile, asked, "lookup")
                if lookup_asked is not None and not lookup_asked:
                    raise ValueError(f"synthesis.lookup_kinds is 'train' but no train task of {request.env!r} has "
                                     "the wording of a lookup form of its profile (the first "
                                     f"{synthesis.train_queries} read): set lookup_kinds: profile")
                lookups, stats = LookupSynthesizer(profile, tuple(synthesis.query_forms), synthesis.max_lookups,
                                                   lookup_asked).propose(exploration)
                proposals += lookups
                result.stats.proposed += stats.proposed
                result.stats.parsed += stats.parsed
            if "multicall" in synthesis.kinds:
                proposals += await self._multicall(request.env, exploration, profile, asked, result)
            result.proposed_kinds.update(proposal_kind(p) for p in proposals)
            for proposal in proposals:
                reference, reason = await verify(context.access, proposal)
                if reference is None:
                    result.rejected[reason] += 1
                    result.rejected_kinds[(proposal_kind(proposal), reason)] += 1
                else:
                    result.verified.append((proposal, reference))
        except Exception as exc:  # one bad episode must not end the job; it is counted and logged
            logger.warning("job {} episode {} failed: {}: {}", job_id, episode, type(exc).__name__, exc)
            result.error = f"{type(exc).__name__}: {exc}"
        if _synthesizes(request):
            result.explain(context.settings.synthesis.kinds)
        elif result.error is not None:
            result.failures.add("episode_error", result.error)
        elif result.exploration is not None and result.exploration.environment_error is not None:
            result.failures.add("environment_error", result.exploration.environment_error)
        if result.exploration is not None and result.exploration.environment_error is not None:
            logger.warning("job {} episode {}: the environment failed: {}", job_id, episode,
                           result.exploration.environment_error)
        return result

    async def _commit_when_writable(self, job_id: str, request: JobRequest, result: EpisodeResult,
                                    progress: dict[str, Any], index: Any) -> None:
        """Commit the episode; while the disk is full, keep it in memory and try again (the job resumes by itself
        once space is freed, and a restart meanwhile redoes the episode from the cursor)."""
        delay = 1.0
        while True:
            try:
                await self._commit(job_id, request, result, progress, index)
                return
            except Exception as exc:
                if not is_disk_full(exc) or job_id in self._cancelled:
                    raise
                logger.warning("job {}: {}; episode {} is committed once there is space (next try in {:.0f}s)",
                               job_id, disk_full_message(exc), result.episode, delay)
            await asyncio.sleep(delay)
            delay = min(2 * delay, DISK_FULL_RETRY_MAX_S)

    async def _multicall(self, env: str, exploration: Exploration, profile: EnvProfile,
                         asked: dict[tuple[str, str], int] | None, result: EpisodeResult) -> list[Proposal]:
        """The multi-call synthesizer's proposals from the exploration's calls, its turned-down candidates counted
        in `result` (a proposal whose observed changes do not replay alone is proposed and rejected; a run of
        changes that is no task of a kind is unmatched)."""
        synthesis = self.context.settings.synthesis
        wanted = None if asked is None else _asked_of(profile, asked, "multicall")
        if not profile.tasks:
            raise ValueError(f"synthesis.kinds has 'multicall' but the profile of {env!r} lists no multi-call "
                             "`tasks`: add them to its profile or drop 'multicall'")
        if wanted is not None and not wanted:
            raise ValueError(f"synthesis.lookup_kinds is 'train' but no train task of {env!r} has the wording of a "
                             f"multi-call form of its profile (the first {synthesis.train_queries} read): set "
                             "lookup_kinds: profile")
        synthesizer = MultiCallSynthesizer(self.context.access, profile, tuple(synthesis.query_forms),
                                           synthesis.max_multicall, wanted)
        proposals, turned_down = await synthesizer.propose(
            observed_calls(exploration), env_type=env, seed_task_id=exploration.seed_task_id,
            initial_state=exploration.initial_state, exploration_id=exploration.exploration_id)
        unreplayed = 0
        for (kind, reason), count in turned_down.items():
            if reason == "no_expected_state":
                unreplayed += count
                result.proposed_kinds[kind] += count
                result.rejected_kinds[(kind, reason)] += count
                result.rejected[reason] += count
            else:
                result.unmatched_kinds[(kind, reason)] += count
        result.stats.proposed += len(proposals) + unreplayed
        result.stats.parsed += len(proposals) + unreplayed
        return proposals

    async def _commit(self, job_id: str, request: JobRequest, result: EpisodeResult, progress: dict[str, Any],
                      index: Any) -> None:
        context, store = self.context, self.context.store
        candidates = []
        for proposal, reference in result.verified:
            sig = signature(proposal)
            goal_key = None
            if reference.end_state is not None:  # one task per goal and query form
                goal: list[Any] = [proposal.seed_task_id, reference.end_state]
                if proposal.lookup is not None:  # every lookup ends where it began: its goal is its answer
                    goal += ["lookup", proposal.lookup.kind, proposal.lookup.identity, proposal.lookup.answer]
                if proposal.task is not None:  # a hindsight goal reaching the same state asks it in other words
                    goal += ["task", proposal.task]
                goal_key = canonical_hash(goal + ["names"] if proposal.query_form == "names" else goal)
            candidates.append((proposal, reference, sig, goal_key))
        vectors = await context.embed([p.query for p, *_ in candidates]) if candidates else []
        _fault("kill_before_commit", result.episode)
        kept: list[Task] = []
        dropped: Counter = Counter()
        dropped_kinds: Counter = Counter()
        with _undone_unless_committed(progress, index), store.transaction() as db:
            for (proposal, reference, sig, goal_key), vector in zip(candidates, vectors or [None] * len(candidates),
                                                                  strict=True):
                reason = index.duplicate_reason(proposal.query, sig, goal_key, vector, reference.outcome_hash()) \
                    if index is not None else None
                if reason is not None:
                    dropped[reason] += 1
                    dropped_kinds[(proposal_kind(proposal), reason)] += 1
                    continue
                # The kind and form travel with the task (a lookup's answer never does: it stays in the reference).
                kind = {"kind": "lookup", "lookup": proposal.lookup.kind} if proposal.lookup else \
                    {"kind": "multicall", "task": proposal.task} if proposal.task else {"kind": "goal"}
                task = Task(task_id=f"syn-{canonical_hash(sig)}", env_type=proposal.env_type, split="train",
                            query=proposal.query, seed_task_id=proposal.seed_task_id, synthetic=True,
                            metadata={"synthesizer": proposal.synthesizer, "query_form": proposal.query_form, **kind,
                                      "task_kind": proposal_kind(proposal)})
                stored = StoredTask(task=task, reference=reference, signature=sig, synthesizer=proposal.synthesizer,
                                    confidence=proposal.confidence, job_id=job_id,
                                    exploration_id=proposal.exploration_id)
                try:
                    store.insert_task(db, stored, goal_key, vector)
                except sqlite3.IntegrityError:
                    dropped["same_reference"] += 1
                    dropped_kinds[(proposal_kind(proposal), "same_reference")] += 1
                    continue
                index.add(proposal.query, sig, goal_key, vector, reference.outcome_hash())
                kept.append(task)
            if result.exploration is not None:
                store.insert_exploration(db, result.exploration)
            _update(progress, result, kept, dropped, dropped_kinds)
            _fault("kill_inside_commit", result.episode)  # the episode's rows written, not yet committed
            store.update_job(db, job_id, cursor=result.episode + 1, progress=progress)
        context.tasks_changed(request.env)
        _fault("kill_after_commit", result.episode)
        if kept:
            # INFO carries ids and counts only: queries are fine, references never reach a log line.
            logger.info("job {} episode {}: kept {} task(s): {}", job_id, result.episode, len(kept),
                        ", ".join(t.task_id for t in kept))


def _synthesizes(request: JobRequest) -> bool:
    """Whether the job proposes tasks (from its own explorations, or from observed agent episodes)."""
    return request.kind in ("synthesize", "observed")


def _check_kinds(env: str, kinds: list[str], profile: EnvProfile) -> None:
    """Refuse a kind of task the environment's profile cannot give, naming the section it lacks."""
    if "lookup" in kinds and not any(op.lookups for op in profile.operations().values()):
        raise ValueError(
            f"task_manager.synthesis.kinds asks for lookup tasks, but the profile of {env!r} has no `lookups` "
            "section in any operation (entities[].opts[].lookups: which record field answers which question; "
            "docs/profile-reference.md): add one to the environment's profile(), or drop "
            "lookup from kinds")


def _found_nothing(request: JobRequest, progress: dict[str, Any]) -> str | None:
    """Why a finished job counts as failed: every exploration failed, or a synthesis job verified nothing.
    None for a job that found something (or explored only)."""
    failures = Failures.model_validate(progress.get("failures") or {})
    done = int(progress.get("episodes_done", 0))
    errors = failures.by_reason.get("environment_error", 0) + failures.by_reason.get("episode_error", 0)
    if done and errors >= done:
        return f"every exploration failed ({done} episodes): {failures.summary()}"
    if _synthesizes(request) and done and not progress.get("verified"):
        rejected = ", ".join(f"{why}: {n}" for why, n in sorted((progress.get("rejected") or {}).items()))
        return (f"{done} explorations gave no verified task ({progress.get('proposed', 0)} proposed"
                + (f"; verification rejected {rejected}" if rejected else "") + f"): {failures.summary()}")
    return None


@contextmanager
def _undone_unless_committed(progress: dict[str, Any], index: DedupIndex | None) -> Iterator[None]:
    """The job's progress and its dedup index as they were, if the transaction inside does not commit."""
    saved_progress, saved_index = copy.deepcopy(progress), index.snapshot() if index is not None else None
    try:
        yield
    except BaseException:
        progress.clear()
        progress.update(saved_progress)
        if index is not None and saved_index is not None:
            index.restore(saved_index)
        raise


def _asked_of(profile: EnvProfile, asked: Collection[tuple[str, str]], what: str) -> set[tuple[str, str]]:
    """The asked (kind, form) pairs that are lookups (`what` lookup) or multi-call tasks (multicall) of the
    profile; none for `goal`."""
    if what == "lookup":
        kinds = {spec.kind for op in profile.operations().values() for spec in op.lookups}
    elif what == "multicall":
        kinds = {spec.kind for spec in profile.tasks}
    else:
        kinds = set()
    return {key for key in asked if key[0] in kinds}


def _update(progress: dict[str, Any], result: EpisodeResult, kept: list[Task], dropped: Counter,
            dropped_kinds: Counter) -> None:
    progress["episodes_done"] += 1
    failures = Failures.model_validate(progress.get("failures") or {})  # a job started before has none
    failures.merge(result.failures)
    progress["failures"] = failures.model_dump()
    if result.error:
        progress["episode_errors"] += 1
    if result.exploration is not None:
        progress["steps"] += len(result.exploration.steps)
        progress["states_reached"] += result.exploration.states_reached
    progress["proposed"] += result.stats.proposed
    progress["parsed"] += result.stats.parsed
    progress["verified"] += len(result.verified)
    progress["kept"] += len(kept)
    for name, counter in (("rejected", result.rejected), ("dropped", dropped)):
        for reason, count in counter.items():
            progress[name][reason] = progress[name].get(reason, 0) + count
    by_kind = progress.setdefault("by_kind", {})  # a job started before kinds were counted has none
    for stage, counter in (("proposed", result.proposed_kinds),
                           ("verified", Counter(proposal_kind(p) for p, _ in result.verified)),
                           ("kept", Counter(t.metadata["task_kind"] for t in kept))):
        for kind, count in counter.items():
            row = by_kind.setdefault(kind, {"proposed": 0, "verified": 0, "kept": 0})
            row[stage] += count
    # Why, per kind: plain counts by reason (rejected by verification, dropped as duplicates, and observed runs
    # of changes that were no task of the kind).
    for stage, counter in (("rejected", result.rejected_kinds), ("dropped", dropped_kinds),
                           ("unmatched", result.unmatched_kinds)):
        for (kind, reason), count in counter.items():
            row = by_kind.setdefault(kind, {"proposed": 0, "verified": 0, "kept": 0})
            reasons = row.setdefault(stage, {})
            reasons[reason] = reasons.get(reason, 0) + count
