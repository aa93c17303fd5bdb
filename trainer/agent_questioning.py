"""Self-questioning for an agent the user already has (`trainer.agent.questioning`): its own tools, run through
the gateway, are the material; the task manager's synthesizers (the same code as in-loop) write the tasks.

1. Explore: `explore_episodes` forced episodes (`force_tools`) on each of the first `explore_tasks` tasks. The
   gateway answers every call that offers tools with a valid call of one of them, its arguments taking values the
   task's opening shows (`tool_arguments`, from the task manager), so the agent's own tools run even where the
   policy would call none, and it records each call with the result the agent sent back.
   Forced episodes are off-policy: they feed synthesis, never the RL update.
2. Synthesize: those (call, result) records go to the task manager as an `observed` job: each episode becomes an
   exploration (replayed for the states it reaches; the results are the ones the agent saw), then the same
   proposal, replay verification, dedup and store as in-loop jobs. Its funnel is per kind.
3. Keep what the agent reaches: each verified task's reference is played through the agent itself, as a
   scripted episode (the gateway gives the reference's replies in the model's own format; the agent's code runs
   the calls with its own tools on a fresh instance of the seed task started with the task's query; an id the
   reference's run generated, an order number, is this run's own in the later replies). A task is kept only when
   that run reaches it: the agent's tools returned what the reference's calls return (up to the ids each run
   generates, by the rule of the task manager's replay), and the task manager grades the run against the
   reference (its answer, its end state). The others count in the kind's
   failures under `agent_tools_differ`, `agent_missed` or `agent_error`.
4. The kept runs are the warm start's data: the reference's calls and closing answer, as the gateway recorded
   them in the agent's own episode (its chat template, its tool-call rendering, its history), the scripted ids
   under the loss mask.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from common.generated_ids import same_but_generated_ids
from common.schemas import Task
from task_manager.client import TaskClient
from task_manager.protocol import Failures, ObservedEpisode, ObservedToolCall
from trainer.agents import AgentFailed, AgentRunner, Played
from trainer.gateway_rollouts import rollout_from_record
from trainer.settings import AgentQuestioningConfig
from trainer.templates import Segment

# The closing reply a scripted run gets after a reference's last tool call (the task manager's multi-call
# references end with the same).
CLOSING_REPLY = "Done."


@dataclass
class KindFunnel:
    """One task kind through questioning: proposed and verified by the task manager, reached by the agent."""

    proposed: int = 0
    verified: int = 0
    stored: int = 0
    played: int = 0
    kept: int = 0
    failures: Failures = field(default_factory=Failures)

    def summary(self) -> dict[str, Any]:
        return {"proposed": self.proposed, "verified": self.verified, "stored": self.stored, "played": self.played,
                "kept": self.kept, "failures": self.failures.model_dump()}


@dataclass
class KeptTask:
    """A synthetic task the agent reached: the task as the agent receives it, its environment task, and the
    scripted episode that reached it (the warm start trains on it)."""

    task: dict[str, Any]
    env_task: Task
    kind: str
    played: Played


@dataclass
class QuestioningReport:
    explored_episodes: int = 0
    explore_failed: int = 0
    observed_calls: int = 0
    job_id: str | None = None
    job_status: str | None = None
    job_error: str | None = None
    job_failures: Failures = field(default_factory=Failures)  # explorations that gave no verified task, by reason
    by_kind: dict[str, KindFunnel] = field(default_factory=dict)
    kept: list[KeptTask] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def kind(self, name: str) -> KindFunnel:
        return self.by_kind.setdefault(name, KindFunnel())

    def summary(self) -> dict[str, Any]:
        return {"explored_episodes": self.explored_episodes, "explore_failed": self.explore_failed,
                "observed_calls": self.observed_calls, "job_id": self.job_id, "job_status": self.job_status,
                "job_error": self.job_error, "job_failures": self.job_failures.model_dump(), "kept": len(self.kept),
                "by_kind": {k: f.summary() for k, f in sorted(self.by_kind.items())}, "errors": self.errors[-10:]}


class AgentQuestioning:
    """Exploration, synthesis and agent-run verification for one environment-backed agent."""

    def __init__(self, config: AgentQuestioningConfig, runner: AgentRunner, tasks: TaskClient, env: str) -> None:
        self.config, self.runner, self.tasks, self.env = config, runner, tasks, env
        self.report = QuestioningReport()

    async def run(self, seed_tasks: list[dict[str, Any]]) -> QuestioningReport:
        observed = await self.explore(seed_tasks[: self.config.explore_tasks])
        if not observed:
            self.report.errors.append("exploration observed no tool call with a result: nothing to synthesize from")
            return self.report
        if await self.synthesize(observed):
            await self.keep_reached()
        return self.report

    async def explore(self, seed_tasks: list[dict[str, Any]], *, grounded: bool = True) -> list[ObservedEpisode]:
        """`grounded`: each forced call's arguments take values the task's opening shows (the task manager's
        `argument_values`: its request's route, dates and names, the tool docs' examples), so that a model that
        writes no sensible argument still calls the tools in ways that return records."""
        values = ([(await self.tasks.argument_values(self.env, self.runner.task_id(t))).tools for t in seed_tasks]
                  if grounded else [None] * len(seed_tasks))
        plays = [(task, self.runner.play(task, force_tools=True, tool_arguments=known, grade=False,
                                         metadata={"purpose": "explore"}))
                 for task, known in zip(seed_tasks, values, strict=True) for _ in range(self.config.explore_episodes)]
        results = await asyncio.gather(*(p for _, p in plays), return_exceptions=True)
        observed = []
        for (task, _), result in zip(plays, results, strict=True):
            self.report.explored_episodes += 1
            if isinstance(result, BaseException):
                self.report.explore_failed += 1
                self.report.errors.append(f"explore {self.runner.task_id(task)}: {result}")
                if not isinstance(result, AgentFailed):
                    raise result
            # An exploration that failed late still ran its tools: what they returned is material all the same.
            record = result.record if isinstance(result, (Played, AgentFailed)) else None
            if record is None:
                continue
            calls = [ObservedToolCall(name=o.name, arguments=o.arguments if isinstance(o.arguments, dict) else {},
                                      result=o.result) for o in record.observed]
            self.report.observed_calls += len(calls)
            if calls:
                observed.append(ObservedEpisode(seed_task_id=self.runner.task_id(task), calls=calls))
        return observed

    async def synthesize(self, observed: list[ObservedEpisode]) -> bool:
        job = await self.tasks.submit_job(self.env, kind="observed",
                                          observed=[o.model_dump() for o in observed])
        job = await self.tasks.wait_job(job.job_id, timeout=self.config.job_timeout_s)
        report = self.report
        report.job_id, report.job_status, report.job_error = job.job_id, job.status, job.error
        report.job_failures = Failures.model_validate(job.progress.get("failures") or {})
        for kind, row in (job.progress.get("by_kind") or {}).items():
            funnel = report.kind(kind)
            funnel.proposed += int(row.get("proposed", 0))
            funnel.verified += int(row.get("verified", 0))
            funnel.stored += int(row.get("kept", 0))
            for stage in ("rejected", "dropped"):
                for reason, count in (row.get(stage) or {}).items():
                    funnel.failures.by_reason[reason] = funnel.failures.by_reason.get(reason, 0) + int(count)
        if job.status != "done":
            logger.warning("questioning: the observed job {} ended {}: {}", job.job_id, job.status, job.error)
        return job.status == "done"

    async def keep_reached(self) -> None:
        """Play each verified task's reference through the agent; keep the tasks its run reaches."""
        served = await self.tasks.training_references(self.env, limit=self.config.max_tasks)
        field_id, field_query = self.runner.config.task_id_field, self.runner.config.query_field
        candidates = []
        for trajectory in served.trajectories:
            metadata = trajectory.metadata
            seed, query = metadata.get("seed_task_id"), metadata.get("query")
            if not seed or not query:
                continue
            env_task = Task(task_id=trajectory.task_id, env_type=self.env, query=query, seed_task_id=seed,
                            synthetic=True, metadata={"task_kind": metadata.get("task_kind", "")})
            self.runner.synthetic[trajectory.task_id] = env_task
            script = [s.action.text() for s in trajectory.steps]
            if trajectory.steps and trajectory.steps[-1].observation is not None:
                # A reference that ends on a tool call (a hindsight goal): the agent's loop asks the model once
                # more after the last result, and a reply without a call ends it.
                script.append(CLOSING_REPLY)
            candidates.append((env_task, {field_id: trajectory.task_id, field_query: query}, script,
                               [s.observation.text() for s in trajectory.steps if s.observation is not None]))
        results = await asyncio.gather(*(self.runner.play(task, script=script, script_results=expected,
                                                          metadata={"purpose": "verify"})
                                         for _, task, script, expected in candidates), return_exceptions=True)
        for (env_task, task, _, results_expected), result in zip(candidates, results, strict=True):
            kind = env_task.metadata.get("task_kind") or "unknown"
            funnel = self.report.kind(kind)
            funnel.played += 1
            if isinstance(result, AgentFailed):
                funnel.failures.add("agent_error", str(result))
            elif isinstance(result, BaseException):
                raise result
            elif not same_but_generated_ids(results_expected,
                                            [o.result for o in result.record.observed][: len(results_expected)]):
                # The agent's tools did not give what the reference's calls give (up to the ids each run generates,
                # as the task manager's replay allows): its run did not reach it.
                funnel.failures.add("agent_tools_differ", f"{env_task.task_id}: the agent's tools returned other "
                                                          "results than the reference's calls")
            elif (result.outcome or 0.0) < 1.0:
                funnel.failures.add("agent_missed", f"{env_task.task_id}: the agent's run of the reference scored "
                                                    f"{result.outcome}")
            else:
                funnel.kept += 1
                self.report.kept.append(KeptTask(task, env_task, kind, result))
        for env_task, *_ in candidates:  # only kept tasks are graded as the runner's synthetic tasks from here on
            if not any(k.env_task.task_id == env_task.task_id for k in self.report.kept):
                self.runner.synthetic.pop(env_task.task_id, None)


def warm_start_segments(kept: list[KeptTask]) -> list[Segment]:
    """The kept runs as training samples: each scripted episode's recorded contexts, the reference's replies (as
    the gateway rendered them into the agent's own episode) under the loss mask."""
    segments = []
    for item in kept:
        built = rollout_from_record(item.played.record, task_id=item.env_task.task_id, outcome=1.0, group_id="warm",
                                    env_type=item.env_task.env_type, off_policy=True)
        segments += built.rollout.segments
    return segments
