"""The mechanisms layer inside veRL's trainer process: the judge once per batch, feedback after each step.

`evolver_sync` calls `label_batch` with the agent loop's per-sample `extra_fields` before its advantage
step, and `after_step` once the step is done. Both go through `trainer.mechanisms.Mechanisms`, the
object the local trainer uses, on an event loop of their own (veRL's trainer is synchronous).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from common.schemas import Trajectory
from estimators.batch import label_values
from trainer.asks import ask_metrics
from trainer.mechanisms import LoopThread, Mechanisms, groups_of
from trainer.verl_plugin.settings import EvolverVerlSettings


def trajectories_of(extras: Sequence[dict[str, Any]]) -> list[Trajectory]:
    """The batch's finished episodes, once each (a trajectory's first segment carries it), in batch order."""
    out: list[Trajectory] = []
    for extra in extras:
        record = extra.get("trajectory")
        if record:
            out.append(Trajectory.model_validate_json(record) if isinstance(record, str)
                       else Trajectory.model_validate(record))
    return out


class VerlMechanisms:
    """Judge and feedback for `evolver_sync`, with the counters of a whole run."""

    def __init__(self, settings: EvolverVerlSettings) -> None:
        self.settings = settings
        self.loop = LoopThread()
        experience = settings.experience
        tasks = settings.tasks
        self.mechanisms = Mechanisms(
            estimator=settings.estimator, experience_ratio=settings.rollout.experience_ratio,
            task_url=tasks.url if tasks else None, experience_url=experience.url if experience else None,
            judge_url=settings.judge_url, experience=experience, tasks=tasks, timeout=settings.timeout_s,
            outage=settings.outage())
        self.loop.run(self.mechanisms.start())
        self.pending: list[Trajectory] = []
        self.pending_step: int | None = None
        self.batch_metrics: dict[str, float] = {}

    def label_batch(self, extras: Sequence[dict[str, Any]], step: int) -> list[Trajectory]:
        """One judge call for the batch when the estimator needs step labels; the labels go into every
        segment's `step_labels` (as per-step values). Keeps the trajectories for `after_step`."""
        trajectories = trajectories_of(extras)
        judgments = self.loop.run(self.mechanisms.label(trajectories))
        if judgments is not None:
            values = {t.trajectory_id: label_values(judgments[t.trajectory_id].labels if t.trajectory_id in judgments
                                                    else None, len(t.steps), t.trajectory_id)
                      for t in trajectories}
            for extra in extras:
                if extra.get("trajectory_id") in values:
                    extra["step_labels"] = values[extra["trajectory_id"]]
        self.pending, self.pending_step = trajectories, step
        if self.settings.experience is not None and self.settings.experience.mode == "action":
            self.batch_metrics = {f"evolver/{k}": v for k, v in ask_metrics(trajectories).items()}
        return trajectories

    def after_step(self) -> None:
        """Summaries, usage feedback and pass rates of the step `label_batch` saw (once per step)."""
        if self.pending_step is None:
            return
        trajectories, step = self.pending, self.pending_step
        self.pending, self.pending_step = [], None
        self.loop.run(self.mechanisms.after_step(groups_of(trajectories), self.settings.rollout.env,
                                                 request_id=f"{self.settings.run_id}-step{step}"))

    def metrics(self) -> dict[str, float]:
        """The peers' counters, and the last batch's asking (experience.mode action)."""
        return {**self.mechanisms.metrics(), **self.batch_metrics}

    def close(self) -> None:
        self.loop.run(self.mechanisms.aclose())
        self.loop.close()
