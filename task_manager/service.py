"""The task manager's core: store, environment access, profiles, jobs, batches, grading, feedback.

The HTTP layer (`app.py`) is a thin shell over this class. Everything that leaves through it is
a `common.schemas.Task` or a number: references stay in the store.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
from loguru import logger

from common.llm import LLMClient
from common.schemas import Task, new_id
from common.service import ServiceError
from task_manager.curriculum import sample_batch, task_key, task_kind
from task_manager.dedup import DedupIndex
from task_manager.envs import EnvAccess
from task_manager.explore import ExploreConfig, argument_values
from task_manager.grading import Grade, GradingError, llm_judge, state_match
from task_manager.jobs import JobContext, JobRunner, new_progress
from task_manager.kinds import asked_kinds, classify, lookup_kinds
from task_manager.lookups import grade_answer
from task_manager.models import StoredTask
from task_manager.profile import EnvProfile, load_profile_file, profile_from_env
from task_manager.protocol import (
    ArgumentValuesRequest,
    BatchRequest,
    Failures,
    FeedbackRequest,
    GradeRequest,
    JobRequest,
    SeedRequest,
    TrainingReferencesRequest,
)
from task_manager.seeding import (
    SeedingRefused,
    SeedReport,
    check_seedable,
    kinds_in_turn,
    reference_trajectory,
    seed_pool,
    seedable_tasks,
    split_for_pool,
)
from task_manager.settings import TaskManagerSettings
from task_manager.store import TaskStore

BUILTIN_PROFILES = Path(__file__).parent / "profiles"


class TaskManager:
    def __init__(self, settings: TaskManagerSettings, env_client: Any) -> None:
        self.settings = settings
        self.store = TaskStore(Path(settings.store_dir) / "tasks.sqlite")
        self.access = EnvAccess(env_client, settings.error_pattern, tuple(settings.volatile_state_keys))
        self.env_client = env_client
        self.jobs = JobRunner(JobContext(
            store=self.store, access=self.access, settings=settings, llm=self.llm, roles=self.roles,
            explore_config=self.explore_config, profile=self.profile, dedup_index=self.dedup_index,
            asked_kinds=self.asked_kinds, recent_queries=self.recent_queries, embed=self.embed,
            tasks_changed=self.tasks_changed))
        self.originals: dict[str, list[Task]] = {}
        self._profiles: dict[str, EnvProfile] = {}
        self._indices: dict[str, DedupIndex] = {}
        self._synthetic: dict[str, list[Task]] | None = None
        # mixture.pool_share: synthetic task ids that seed the pool, and those withheld because a pool
        # demonstration shows their answer; batches sample neither
        self._pool_only: set[str] = set()
        self._withheld: set[str] = set()
        self._llms: dict[str, LLMClient] = {}
        self._embed_lock = asyncio.Lock()
        self._asked: dict[str, dict[tuple[str, str], int]] = {}  # env -> (kind, form) -> train tasks
        self.seeding: dict[str, dict[str, Any]] = {}  # env -> the latest pool-seeding report (run summary)
        self.ready = False
        # Profiles named in config are read now: a wrong path fails at start, not in a job.
        for env, path in settings.profiles.items():
            self._profiles[env] = load_profile_file(path)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Load the environments' original tasks (retrying until the env service answers), resume jobs."""
        delay = 0.5
        while True:
            try:
                for env in self.settings.environments:
                    ids = await self.access.task_ids(env, "train")
                    self.originals[env] = [Task(task_id=i, env_type=env, split="train") for i in ids]
                break
            except Exception as exc:
                logger.warning("environment service at {} not ready ({}); retrying", self.settings.env_url, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        self.ready = True
        for job in self.store.jobs():
            if job["status"] in ("queued", "running"):
                logger.info("resuming job {} at episode {}", job["job_id"], job["cursor"])
                self.jobs.start(job["job_id"])

    async def close(self) -> None:
        await self.jobs.close()
        for llm in self._llms.values():
            await llm.aclose()
        self.store.close()

    # ------------------------------------------------------------ building blocks for jobs

    def llm(self, role: str) -> LLMClient:
        if role not in self._llms:
            config = getattr(self.settings.llm, role)
            if config is None:
                raise ServiceError(400, "llm_not_configured",
                                   f"the {role} role needs an LLM: set task_manager.llm.{role} (base_url, model)")
            self._llms[role] = LLMClient(role, config)
        return self._llms[role]

    def roles(self, request: JobRequest) -> tuple[str, str]:
        explorer = request.explorer or self.settings.explore.explorer
        synthesizer = request.synthesizer or self.settings.synthesis.synthesizer
        if explorer == "auto":
            explorer = "llm" if self.settings.llm.explorer else "random"
        if synthesizer == "auto":
            synthesizer = "llm" if self.settings.llm.synthesizer else "hindsight"
        return explorer, synthesizer

    def explore_config(self, request: JobRequest) -> ExploreConfig:
        base = self.settings.explore
        return ExploreConfig(
            breadth_steps=request.breadth_steps if request.breadth_steps is not None else base.breadth_steps,
            depth_steps=request.depth_steps if request.depth_steps is not None else base.depth_steps,
            window=request.window if request.window is not None else base.window,
            breadth_temperature=base.breadth_temperature, depth_temperature=base.depth_temperature)

    async def profile(self, env: str) -> EnvProfile:
        if env not in self._profiles:
            builtin = BUILTIN_PROFILES / f"{env}.json"
            if builtin.is_file():
                self._profiles[env] = load_profile_file(builtin)
            else:
                self._profiles[env] = profile_from_env(env, await self.access.profile(env),
                                                       await self.access.tool_docs(env))
        return self._profiles[env]

    async def embed(self, texts: list[str]) -> list[np.ndarray] | None:
        if not self.settings.dedup.embeddings or not texts:
            return None
        from common.embeddings import shared_embedder

        async with self._embed_lock:
            matrix = await asyncio.to_thread(shared_embedder().encode, texts)
        return list(matrix)

    async def dedup_index(self, env: str) -> DedupIndex:
        if env not in self._indices:
            await self._load_heldout(env)
            dedup = self.settings.dedup
            self._indices[env] = await asyncio.to_thread(self.store.dedup_index, env, dedup.threshold,
                                                         dedup.contamination_threshold)
        return self._indices[env]

    async def _load_heldout(self, env: str) -> None:
        """Read the held-out evaluation queries once (kept in the store) for the contamination check."""
        dedup = self.settings.dedup
        if self.store.heldout(env) or not dedup.heldout_splits or dedup.max_heldout == 0:
            return
        items: list[tuple[str, str]] = []
        for split in dedup.heldout_splits:
            for task_id in (await self.access.task_ids(env, split))[: dedup.max_heldout]:
                async with self.access.instance(env, task_id) as instance:
                    query = next((str(m.get("content") or "") for m in instance.messages if m.get("role") == "user"), "")
                if query:
                    items.append((f"{split}/{task_id}", query))
        vectors = await self.embed([q for _, q in items])
        self.store.set_heldout(env, [(tid, q, vectors[i] if vectors else None) for i, (tid, q) in enumerate(items)])
        logger.info("read {} held-out {} queries for the contamination check", len(items), env)

    async def asked_kinds(self, env: str) -> dict[tuple[str, str], int]:
        """The (kind, form) pairs of lookups and multi-call tasks the environment's own train tasks ask, read from
        the queries of the first `synthesis.train_queries` of them (never a held-out task); those tasks get their
        kind label."""
        if env not in self._asked:
            profile = await self.profile(env)
            originals = self.originals.get(env, [])[: self.settings.synthesis.train_queries]
            gate = asyncio.Semaphore(8)

            async def query_of(task: Task) -> str:
                async with gate, self.access.instance(env, task.task_id) as instance:
                    return next((str(m.get("content") or "") for m in instance.messages if m.get("role") == "user"),
                                "")

            queries = await asyncio.gather(*(query_of(t) for t in originals))
            labels = lookup_kinds(profile)
            for task, query in zip(originals, queries, strict=True):
                key = classify(profile, query)
                if key is not None:  # the label travels with the task: curriculum and retrieval use it
                    task.metadata["task_kind"] = labels[key][2]
            self._asked[env] = asked_kinds(profile, queries)
            logger.info("{}: {} of {} train queries read are lookups or multi-call tasks: {}", env, sum(self._asked[env].values()),
                        len(queries), {f"{k}/{f}": n for (k, f), n in self._asked[env].items()})
        return self._asked[env]

    def recent_queries(self, env: str, limit: int = 10) -> list[str]:
        return [t.query or "" for t in self.synthetic_tasks().get(env, [])[-limit:]]

    def tasks_changed(self, env: str) -> None:
        self._synthetic = None

    def synthetic_tasks(self) -> dict[str, list[Task]]:
        if self._synthetic is None:
            by_env: dict[str, list[StoredTask]] = {}
            for stored in self.store.tasks(synthetic=True):
                by_env.setdefault(stored.task.env_type, []).append(stored)
            self._pool_only, self._withheld = set(), set()
            for stored_tasks in by_env.values():
                split = split_for_pool(stored_tasks, self.settings.mixture.pool_share)
                self._pool_only |= split.pool
                self._withheld |= split.withheld
            self._synthetic = {env: [s.task for s in items] for env, items in by_env.items()}
        return self._synthetic

    def training_tasks(self, env: str | None) -> list[Task]:
        """The synthetic tasks batches sample: all but the pool's share and the tasks it gives away."""
        self.synthetic_tasks()  # computes the pool's share and the withheld tasks with the cache
        excluded = self._pool_only | self._withheld
        return [t for t in self.all_tasks(env, True) if t.task_id not in excluded]

    # ------------------------------------------------------------ API operations

    def submit(self, request: JobRequest) -> dict[str, Any]:
        if request.env not in self.settings.environments:
            raise ServiceError(404, "unknown_environment", f"environment {request.env!r} is not served by this task "
                               f"manager; configured: {', '.join(self.settings.environments)} "
                               "(task_manager.environments)")
        if request.episodes > self.settings.max_episodes_per_job:
            raise ServiceError(400, "too_many_episodes", f"episodes={request.episodes} exceeds "
                               f"task_manager.max_episodes_per_job={self.settings.max_episodes_per_job}")
        explorer, synthesizer = self.roles(request)
        if explorer == "llm" and request.observed is None:  # observed episodes are explored by the agent
            self.llm("explorer")
        if request.kind != "explore" and synthesizer == "llm":
            self.llm("synthesizer")
        job_id = new_id("job")
        self.store.create_job(job_id, request.kind, request.model_dump(), new_progress(request.episodes))
        self.jobs.start(job_id)
        return self.job(job_id)

    def job(self, job_id: str) -> dict[str, Any]:
        job = self.store.job(job_id)
        if job is None:
            raise ServiceError(404, "unknown_job", f"no job {job_id!r} (list them with GET /v1/jobs)")
        return job

    def cancel(self, job_id: str) -> dict[str, Any]:
        job = self.job(job_id)
        if job["status"] in ("queued", "running"):
            self.jobs.cancel(job_id)
            if job_id not in self.jobs.tasks or self.jobs.tasks[job_id].done():
                self.store.set_job(job_id, status="cancelled")
        return self.job(job_id)

    def all_tasks(self, env: str | None, synthetic: bool | None) -> list[Task]:
        envs = [env] if env else self.settings.environments
        out: list[Task] = []
        for name in envs:
            if synthetic in (None, False):
                out.extend(self.originals.get(name, []))
            if synthetic in (None, True):
                out.extend(self.synthetic_tasks().get(name, []))
        return out

    def get_task(self, task_id: str, env: str | None = None) -> tuple[Task, tuple[float, int] | None]:
        stored = self.store.get(task_id)
        if stored is not None and (env is None or stored.task.env_type == env):
            task = stored.task
        else:
            matches = [t for name, tasks in self.originals.items() if env in (None, name) for t in tasks
                       if t.task_id == task_id]
            if not matches:
                raise ServiceError(404, "unknown_task", f"no task {task_id!r}"
                                   + (f" in environment {env!r}" if env else "") + " (list them with GET /v1/tasks)")
            if len(matches) > 1:
                raise ServiceError(400, "ambiguous_task", f"task id {task_id!r} exists in several environments "
                                   f"({', '.join(t.env_type for t in matches)}); pass env_type")
            task = matches[0]
        return task, self.store.pass_rates().get(task_key(task))

    def sample(self, request: BatchRequest) -> dict[str, Any]:
        if request.env is not None and request.env not in self.settings.environments:
            raise ServiceError(404, "unknown_environment", f"environment {request.env!r} is not served; "
                               f"configured: {', '.join(self.settings.environments)}")
        mixture, curriculum = self.settings.mixture, self.settings.curriculum
        ratio = mixture.synthetic_ratio if request.synthetic_ratio is None else request.synthetic_ratio
        rng = random.Random(request.seed) if request.seed is not None else random.Random()
        plan = sample_batch(self.all_tasks(request.env, False), self.training_tasks(request.env),
                            self.store.pass_rates(), request.batch_size, ratio, mixture.use_original, curriculum, rng,
                            self.store.tries())
        if not plan.tasks:
            if self.all_tasks(request.env, True):
                raise ServiceError(409, "no_tasks", f"no tasks to sample: every synthetic task seeds the experience "
                                   f"pool (task_manager.mixture.pool_share={mixture.pool_share}) or is withheld "
                                   "because a pool demonstration shows its answer; lower pool_share or synthesize "
                                   "more tasks")
            raise ServiceError(409, "no_tasks", "no tasks to sample: the environments have no train tasks and no "
                               "synthetic task exists yet (submit a synthesize job)")
        return {"tasks": plan.tasks, "original": plan.original, "synthetic": plan.synthetic, "in_band": plan.in_band,
                "curriculum": curriculum.enabled, "unsolved_kinds": plan.unsolved_kinds}

    def _stored_synthetic(self, task_id: str, original_note: str) -> StoredTask:
        stored = self.store.get(task_id)
        if stored is None:
            if any(t.task_id == task_id for tasks in self.originals.values() for t in tasks):
                raise ServiceError(409, "original_task", f"{task_id!r} is an original task: {original_note}")
            raise ServiceError(404, "unknown_task", f"no synthetic task {task_id!r}")
        assert stored.reference is not None
        return stored

    def reference(self, task_id: str) -> dict[str, Any]:
        """A synthetic task's reference calls and answer (for the judge's reference-guided attribution)."""
        reference = self._stored_synthetic(task_id, "it has no verified reference here").reference
        assert reference is not None
        calls = [c.model_dump() for c in reference.calls] if reference.calls is not None else None
        return {"task_id": task_id, "actions": reference.actions, "calls": calls, "answer": reference.answer}

    async def grade(self, request: GradeRequest) -> Grade:
        stored = self._stored_synthetic(request.task_id, "it is graded by the environment's own evaluate "
                                                  "(POST /v1/instances/{id}/evaluate)")
        if stored.reference.answer is not None:  # a lookup: graded on its closing reply, as the env grades its own
            try:
                return grade_answer(stored, request.trajectory, request.state, self.access.comparable)
            except GradingError as exc:
                raise ServiceError(400, "nothing_to_grade", str(exc)) from None
        if request.state is not None and stored.reference.end_state is not None:
            return state_match(stored, request.state, tuple(self.settings.volatile_state_keys))
        if request.trajectory is not None:
            if self.settings.llm.judge is None:
                raise ServiceError(400, "llm_not_configured", "grading this task from a trajectory needs an LLM "
                                   "judge: set task_manager.llm.judge, or send the final state snapshot as `state`")
            try:
                return await llm_judge(self.llm("judge"), stored, request.trajectory)
            except GradingError as exc:
                raise ServiceError(502, "judge_failed", str(exc)) from None
        needs = "`state` (the final state snapshot)" if stored.reference.end_state is not None else "`trajectory`"
        raise ServiceError(400, "nothing_to_grade", f"send {needs} to grade task {request.task_id!r}")

    def feedback(self, request: FeedbackRequest) -> tuple[int, bool]:
        """(tasks updated, whether this request_id was applied before and so changed nothing now)."""
        outcomes: dict[str, list[float]] = {}
        for item in request.results:
            bad = [v for v in item.outcomes if not 0.0 <= v <= 1.0]
            if bad:
                raise ServiceError(422, "validation_error", f"results[{item.task_id}].outcomes must be rewards in "
                                   f"[0, 1], got {bad[:3]}")
            task, _ = self.get_task(item.task_id, item.env_type)
            outcomes.setdefault(task_key(task), []).extend(item.outcomes)
        applied = self.store.record_outcomes(outcomes, self.settings.curriculum.window, request.request_id)
        return len(outcomes), not applied

    async def seed_experience(self, request: SeedRequest) -> dict[str, Any]:
        """Seed an experience pool from verified synthetic tasks grown from train tasks (never held-out ones)."""
        from experience_manager.client import ExperienceClient

        if request.env not in self.settings.environments:
            raise ServiceError(404, "unknown_environment", f"environment {request.env!r} is not served; "
                               f"configured: {', '.join(self.settings.environments)}")
        experience_url = self.settings.experience_url
        if experience_url is None:
            raise ServiceError(400, "experience_manager_not_configured", "pool seeding needs "
                               "task_manager.experience_url (the launcher sets it when experience_manager runs)")
        train_ids = {t.task_id for t in self.originals.get(request.env, [])}
        synthetic = self.synthetic_tasks().get(request.env, [])
        share = self.settings.mixture.pool_share
        report = SeedReport()
        try:
            if request.task_ids is not None:
                ids = list(dict.fromkeys(request.task_ids))
                heldout = {i: split for split in ("validation", "test")
                           for i in await self.access.task_ids(request.env, split)}
                chosen = [check_seedable(self.store.get(i), i, train_ids, heldout) for i in ids]
                wrong_env = [s.task.task_id for s in chosen if s.task.env_type != request.env]
                if wrong_env:
                    raise SeedingRefused(f"task(s) {', '.join(wrong_env)} belong to another environment than "
                                         f"{request.env!r}")
                trained = [s.task.task_id for s in chosen if share > 0 and s.task.task_id not in self._pool_only]
                if trained:
                    raise SeedingRefused(f"task(s) {', '.join(trained)} are training tasks (not in the pool's share, "
                                         f"mixture.pool_share={share}): their demonstrations would hold answers the "
                                         "trainer is rewarded for; seed only the pool's share")
            else:
                ids = seedable_tasks(synthetic, train_ids)
                report.refused = len(synthetic) - len(ids)
                if share > 0:
                    pool = [i for i in ids if i in self._pool_only]
                    report.kept_for_training, ids = len(ids) - len(pool), pool
                chosen = [check_seedable(self.store.get(i), i, train_ids) for i in ids]
        except SeedingRefused as exc:
            raise ServiceError(400, "not_seedable", str(exc)) from None
        chosen = chosen[: request.limit]
        report.candidates = len(chosen)
        client = ExperienceClient(experience_url, timeout=600.0)
        try:
            await seed_pool(self.access, chosen, client, request.workspace, request_id=request.request_id,
                            report=report)
        except ServiceError:
            raise
        except Exception as exc:  # the experience manager refused or is down: say which peer and why
            raise ServiceError(502, "experience_manager_failed",
                               f"seeding {request.workspace!r} at {experience_url} failed: {exc}") from None
        finally:
            await client.aclose()
        logger.info("seeded experience workspace {} from {} of {} synthetic {} tasks", request.workspace,
                    report.sent, report.candidates, request.env)
        result = {"env": request.env, "workspace": request.workspace, **vars(report)}
        self.seeding[request.env] = {k: v for k, v in result.items() if k != "task_ids"}
        return result

    def funnel_by_kind(self) -> dict[str, dict[str, Any]]:
        """Per task kind: proposed, verified and kept (by the jobs), held for the pool, withheld (a pool
        demonstration shows their answer), trainable (what batches sample), and rollouts tried and solved
        (original tasks of the kind included); and where the jobs counted any, why, as plain counts by reason:
        `rejected` (verification), `dropped` (duplicates) and `unmatched` (observed runs of changes that were no
        task of the kind: the multi-call synthesizer's)."""
        rows: dict[str, dict[str, int]] = {}

        def row(kind: str) -> dict[str, int]:
            return rows.setdefault(kind, dict.fromkeys(("proposed", "verified", "kept", "held", "withheld",
                                                        "trainable", "tries", "solved"), 0))

        reasons: dict[str, dict[str, dict[str, int]]] = {}  # kind -> rejected/dropped/unmatched -> reason -> count
        for job in self.store.jobs():
            for kind, counts in job["progress"].get("by_kind", {}).items():
                for stage in ("proposed", "verified", "kept"):
                    row(kind)[stage] += int(counts.get(stage, 0))
                for stage in ("rejected", "dropped", "unmatched"):
                    for reason, count in counts.get(stage, {}).items():
                        into = reasons.setdefault(kind, {}).setdefault(stage, {})
                        into[reason] = into.get(reason, 0) + int(count)
        for task in self.all_tasks(None, True):
            stage = "held" if task.task_id in self._pool_only else \
                "withheld" if task.task_id in self._withheld else "trainable"
            row(str(task.metadata.get("task_kind") or task_kind(task) or "unknown"))[stage] += 1
        tries = self.store.tries()
        for task in self.all_tasks(None, None):
            kind, seen = task.metadata.get("task_kind"), tries.get(task_key(task))
            if kind and seen:
                row(str(kind))["tries"] += seen[0]
                row(str(kind))["solved"] += seen[1]
        return {kind: {**counts, **reasons.get(kind, {})} for kind, counts in sorted(rows.items())}

    async def argument_values(self, request: ArgumentValuesRequest) -> dict[str, Any]:
        if request.env not in self.settings.environments:
            raise ServiceError(404, "unknown_environment", f"environment {request.env!r} is not served; "
                               f"configured: {', '.join(self.settings.environments)}")
        tools = await argument_values(self.access, request.env, request.seed_task_id)
        return {"env": request.env, "seed_task_id": request.seed_task_id, "tools": tools}

    async def training_references(self, request: TrainingReferencesRequest) -> dict[str, Any]:
        """The trainable synthetic tasks (what batches sample, grown from train tasks) solved by their references;
        where `limit` cuts them, one of each kind in turn, so that the first `limit` keep every kind.

        Never a task of the pool's share or withheld because the pool shows its answer, never one grown from a
        held-out task: `check_seedable` guards every task that is replayed."""
        if not self.settings.serve_training_references:
            raise ServiceError(403, "references_not_served", "this task manager does not serve references; set "
                               "task_manager.serve_training_references: true (trainer.warm_start with source: synthetic "
                               "needs it; the launcher sets it)")
        if request.env not in self.settings.environments:
            raise ServiceError(404, "unknown_environment", f"environment {request.env!r} is not served; "
                               f"configured: {', '.join(self.settings.environments)}")
        train_ids = {t.task_id for t in self.originals.get(request.env, [])}
        synthetic = self.synthetic_tasks().get(request.env, [])
        training = self.training_tasks(request.env)
        ids = seedable_tasks(training, train_ids)
        stored = [self.store.get(i) for i in ids]
        verified = [check_seedable(s, i, train_ids) for s, i in zip(stored, ids, strict=True)
                    if s is not None and s.reference is not None]
        # Interleaved by kind only when the limit cuts: the first N then hold every kind, and an uncut list keeps
        # the order earlier runs trained on.
        chosen = kinds_in_turn(verified)[: request.limit] if len(verified) > request.limit else verified
        trajectories = []
        for item in chosen:
            trajectory = await reference_trajectory(self.access, item)
            if trajectory is not None:
                trajectories.append(trajectory)
        logger.info("served {} replayed references of {} trainable synthetic {} tasks", len(trajectories),
                    len(chosen), request.env)
        return {"env": request.env, "trainable": len(verified),
                "pool_held": sum(t.task_id in self._pool_only for t in synthetic),
                "withheld": sum(t.task_id in self._withheld for t in synthetic),
                "refused": len(training) - len(verified), "replayed": len(trajectories),
                "replay_failed": len(chosen) - len(trajectories), "trajectories": trajectories}

    def stats(self) -> dict[str, Any]:
        rates = self.store.pass_rates()
        curriculum = self.settings.curriculum
        envs = {}
        for env in self.settings.environments:
            synthetic = self.synthetic_tasks().get(env, [])
            by_synth: dict[str, int] = {}
            for task in synthetic:
                name = task.metadata.get("synthesizer", "")
                by_synth[name] = by_synth.get(name, 0) + 1
            envs[env] = {"original": len(self.originals.get(env, [])), "synthetic": len(synthetic),
                         "pool_only": sum(t.task_id in self._pool_only for t in synthetic),
                         "withheld": sum(t.task_id in self._withheld for t in synthetic),
                         "by_synthesizer": by_synth}
        funnel = {k: 0 for k in ("episodes_done", "proposed", "parsed", "verified", "kept")}
        jobs: dict[str, int] = {}
        failures = Failures()
        for job in self.store.jobs():
            jobs[job["status"]] = jobs.get(job["status"], 0) + 1
            for key in funnel:
                funnel[key] += int(job["progress"].get(key, 0))
            failures.merge(Failures.model_validate(job["progress"].get("failures") or {}))
        tracked = [r for r, n in rates.values() if n]
        return {
            "environments": envs, "jobs": jobs, "funnel": funnel, "funnel_by_kind": self.funnel_by_kind(),
            "failures": failures.model_dump(),  # explorations that gave no verified task, by reason
            "explorations": self.store.exploration_count(),
            "seeding": self.seeding,
            "pass_rates": {"tracked": len(tracked),
                           "in_band": sum(1 for r in tracked if curriculum.low <= r <= curriculum.high),
                           "mean": (sum(tracked) / len(tracked)) if tracked else None},
            "time": time.time(),
        }
