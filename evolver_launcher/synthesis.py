"""Self-questioning before training: one synthesis job per environment on the task manager.

AgentEvolver generates its synthetic tasks before the first training step; so does a run here when
`launcher.synthesis.episodes > 0`. The jobs run in a background thread while the supervisor keeps
watching every child; the trainer starts once they are done (a failed job stops the run).

With `launcher.synthesis.seed_experience`, self-questioning then feeds self-navigating: the task manager
replays the verified synthetic tasks' references and has the experience manager summarize them into the
trainer's workspace (`POST /v1/seed_experience`; it refuses held-out tasks). A resumed run sends the
same request id, which the experience manager applies once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from task_manager.client import TaskClient


class SynthesisFailed(RuntimeError):
    pass


class SynthesisGate:
    """Callable gate for the trainer: False while the jobs run, True when done; raises if one failed."""

    def __init__(self, url: str, environments: list[str], episodes: int, timeout_s: float,
                 say: Callable[[str], None], *, experience_url: str | None = None, workspace: str = "default",
                 run_name: str = "run") -> None:
        self.url, self.environments, self.episodes, self.timeout_s = url, environments, episodes, timeout_s
        self.say = say
        self.experience_url, self.workspace, self.run_name = experience_url, workspace, run_name
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

    def _run(self) -> None:
        try:
            asyncio.run(self._jobs())
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
                if info.status != "done":
                    raise SynthesisFailed(f"synthesis job {job.job_id} on {env} ended {info.status}: {info.error}")
                progress = info.progress
                self.results[env] = progress
                self.say(f"self-questioning on {env}: {progress.get('episodes_done')} episodes, "
                         f"{progress.get('proposed')} tasks proposed, {progress.get('verified')} verified, "
                         f"{progress.get('kept')} kept ({time.monotonic() - started:.0f}s)")
            if self.experience_url:
                pool = await self._pool_size() if resumed else 0
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
        report = await client.seed_experience(env, self.experience_url or "", self.workspace,
                                              request_id=f"seed-{self.run_name}-{env}-{self.workspace}",
                                              timeout=self.timeout_s)
        self.results.setdefault(env, {})["seeding"] = report.model_dump(exclude={"task_ids"})
        self.say(f"self-navigating seeded from self-questioning on {env}: {report.sent} of {report.candidates} "
                 f"verified synthetic tasks replayed into workspace {self.workspace!r}, "
                 f"{report.experiences_created} experiences created ({report.refused} refused, "
                 f"{report.replay_failed} failed to replay; {time.monotonic() - started:.0f}s)")
