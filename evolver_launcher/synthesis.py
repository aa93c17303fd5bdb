"""Self-questioning before training: one synthesis job per environment on the task manager.

AgentEvolver generates its synthetic tasks before the first training step; so does a run here when
`launcher.synthesis.episodes > 0`. The jobs run in a background thread while the supervisor keeps
watching every child; the trainer starts once they are done. A failed job stops the run, quoting why (a
job fails when every exploration failed, or when it verified no task: the task manager counts the reasons);
`launcher.synthesis.allow_no_tasks: true` trains on the environment's own tasks instead.

With `launcher.synthesis.seed_experience`, self-questioning then feeds self-navigating: the task manager
replays the verified synthetic tasks' references and has the experience manager summarize them into the
trainer's workspace (`POST /v1/seed_experience`; it refuses held-out tasks). A resumed run sends the
same request id, which the experience manager applies once.

Where the services run without the launcher (docker compose), the same step runs on its own before the
trainer: `python -m evolver_launcher.synthesis --conf run.yaml` reads `launcher.synthesis`, the task
manager's environments and the trainer's peer URLs from the run YAML.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from common.config import ConfigError, compose, validate
from evolver_launcher.settings import LauncherSettings
from task_manager.client import TaskClient
from task_manager.protocol import Failures


class SynthesisFailed(RuntimeError):
    pass


class SynthesisGate:
    """Callable gate for the trainer: False while the jobs run, True when done; raises if one failed."""

    def __init__(self, url: str, environments: list[str], episodes: int, timeout_s: float,
                 say: Callable[[str], None], *, seed_experience: bool = False, experience_url: str | None = None,
                 workspace: str = "default",
                 run_name: str = "run", allow_no_tasks: bool = False) -> None:
        self.url, self.environments, self.episodes, self.timeout_s = url, environments, episodes, timeout_s
        self.say = say
        self.seed_experience, self.workspace, self.run_name = seed_experience, workspace, run_name
        self.allow_no_tasks = allow_no_tasks
        self.experience_url = experience_url  # only to see whether a resumed run's pool is already seeded
        self.results: dict[str, dict] = {}
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._error: str | None = None

    def __call__(self) -> bool:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="synthesis", daemon=True)
            self._thread.start()
        if self._error:
            raise SynthesisFailed(self._error)
        return self._done.is_set()

    def run(self) -> dict[str, dict]:
        """The jobs (and seeding) in the calling thread; each environment's funnel. Raises on failure."""
        asyncio.run(self._jobs())
        return self.results

    def _run(self) -> None:
        try:
            self.run()
        except Exception as exc:  # reported by the supervisor, with the task manager's log
            self._error = f"{type(exc).__name__}: {exc}"
        else:
            self._done.set()

    async def _jobs(self) -> None:
        client = TaskClient(self.url, timeout=60)
        try:
            stats = await client.stats()
            resumed: set[str] = set()
            for env in self.environments:
                have = ((stats.get("environments") or {}).get(env) or {}).get("synthetic", 0)
                if have:
                    self.say(f"self-questioning: {have} synthetic {env} tasks already in the store (resumed run)")
                    resumed.add(env)
                    continue
                started = time.monotonic()
                self.say(f"self-questioning: exploring {env} for {self.episodes} episodes before training")
                job = await client.submit_job(env, episodes=self.episodes)
                info = await client.wait_job(job.job_id, timeout=self.timeout_s, poll=1.0)
                if info.status == "failed" and self.allow_no_tasks:
                    self.results[env] = info.progress
                    self.say(f"self-questioning on {env} found no task: {info.error}; training on its own tasks "
                             "only (launcher.synthesis.allow_no_tasks)")
                    continue
                if info.status != "done":
                    raise SynthesisFailed(f"synthesis job {job.job_id} on {env} ended {info.status}: {info.error} "
                                          "(the task manager's log has each episode; launcher.synthesis."
                                          "allow_no_tasks: true trains without synthetic tasks)")
                progress = info.progress
                self.results[env] = progress
                self.say(f"self-questioning on {env}: {progress.get('episodes_done')} episodes, "
                         f"{progress.get('proposed')} tasks proposed, {progress.get('verified')} verified, "
                         f"{progress.get('kept')} kept ({time.monotonic() - started:.0f}s)" + _no_task_line(progress))
            if self.seed_experience:
                pool = await self._pool_size() if resumed and self.experience_url else 0
                for env in self.environments:
                    if env in resumed and pool:
                        # A resumed run's pool persisted with it. Seeding again would replay the references into
                        # new trajectories (fresh order ids), which the experience manager refuses under the same
                        # request id (409 request_id_conflict).
                        self.say(f"self-navigating: workspace {self.workspace!r} already holds {pool} experiences "
                                 f"(resumed run); not seeded again from {env}")
                        continue
                    await self._seed(client, env)
        finally:
            await client.aclose()

    async def _pool_size(self) -> int:
        """Active experiences in the trainer's workspace (0 when it does not exist yet)."""
        from common.http import ServiceCallError
        from experience_manager.client import ExperienceClient

        async with ExperienceClient(self.experience_url or "") as pool:
            try:
                return int((await pool.stats(self.workspace)).get("active", 0))
            except ServiceCallError as exc:
                if exc.status == 404:
                    return 0
                raise

    async def _seed(self, client: TaskClient, env: str) -> None:
        started = time.monotonic()
        report = await client.seed_experience(env, self.workspace, request_id=f"seed-{self.run_name}-{env}-{self.workspace}",
                                              timeout=self.timeout_s)
        self.results.setdefault(env, {})["seeding"] = report.model_dump(exclude={"task_ids"})
        self.say(f"self-navigating seeded from self-questioning on {env}: {report.sent} of {report.candidates} "
                 f"verified synthetic tasks replayed into workspace {self.workspace!r}, "
                 f"{report.experiences_created} experiences created ({report.kept_for_training} kept for training, "
                 f"{report.refused} refused, "
                 f"{report.replay_failed} failed to replay; {time.monotonic() - started:.0f}s)")


def _no_task_line(progress: dict[str, Any]) -> str:
    """`; episodes with no task: no_state_change: 1` from a job's progress ('' when every episode gave one)."""
    failures = Failures.model_validate(progress.get("failures") or {})
    return f"; episodes with no task: {failures.summary()}" if failures.total() else ""


# ------------------------------------------------------------------ standalone (docker compose)


def _peer_url(raw: dict[str, Any], name: str) -> str | None:
    url = ((raw.get("trainer") or {}).get("services") or {}).get(name)
    if url is not None and not isinstance(url, str):
        raise ConfigError(f"trainer.services.{name}: must be a URL string, got {url!r}")
    return url


def gate_from_config(raw: dict[str, Any], say: Callable[[str], None], run_name: str) -> SynthesisGate | None:
    """The gate the launcher would attach for this run YAML, its peers found by the trainer's URLs; None
    when `launcher.synthesis.episodes` is 0."""
    settings = validate(LauncherSettings, raw.get("launcher") or {}, root="launcher").synthesis
    if not settings.episodes:
        if settings.seed_experience:
            raise ConfigError("launcher.synthesis.seed_experience: seeding the pool from synthetic tasks needs "
                              "launcher.synthesis.episodes > 0")
        return None
    task_url = _peer_url(raw, "task_url")
    if not task_url:
        raise ConfigError("trainer.services.task_url: launcher.synthesis.episodes > 0 needs the task manager's URL")
    environments = (raw.get("task_manager") or {}).get("environments")
    if not isinstance(environments, list) or not environments or not all(isinstance(e, str) for e in environments):
        raise ConfigError("task_manager.environments: list the environments to explore (e.g. [flights])")
    experience_url = None
    if settings.seed_experience:
        experience_url = _peer_url(raw, "experience_url")
        if not experience_url:
            raise ConfigError("trainer.services.experience_url: launcher.synthesis.seed_experience needs the "
                              "experience manager's URL")
    workspace = ((raw.get("trainer") or {}).get("experience") or {}).get("workspace", "default")
    return SynthesisGate(task_url, environments, settings.episodes, settings.timeout_s, say=say,
                         seed_experience=settings.seed_experience, experience_url=experience_url,
                         workspace=workspace, run_name=run_name, allow_no_tasks=settings.allow_no_tasks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evolver_launcher.synthesis",
        description="Self-questioning before training, against running services (what the launcher does "
                    "before it starts the trainer); exit 0 when the task store is ready to train on.")
    parser.add_argument("--conf", required=True, help="the run's YAML (launcher.synthesis, task_manager, trainer)")
    parser.add_argument("--run-name", default="run", help="names the seeding request (a rerun is applied once)")
    parser.add_argument("overrides", nargs="*", help="key.path=value overrides, e.g. launcher.synthesis.episodes=4")
    args = parser.parse_args(argv)

    def say(message: str) -> None:
        print(f"[synthesis] {message}", flush=True)

    try:
        gate = gate_from_config(compose(args.conf, args.overrides), say, args.run_name)
    except ConfigError as exc:
        print(f"synthesis: {exc}", file=sys.stderr)
        return 2
    if gate is None:
        say("launcher.synthesis.episodes is 0: no self-questioning before training")
        return 0
    try:
        gate.run()
    except Exception as exc:  # a failed job or an unreachable task manager: the trainer must not start
        print(f"synthesis: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
