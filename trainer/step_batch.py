"""One training step's batch, from rollout to loss: built once per step by the trainer, read by the
estimator and the update.

A step has B rollouts in task groups. Rollout i holds S_i training segments (the template's own
`Segment` objects: prompt ids, response ids, loss mask, step ids; experience stripped), N_i = the sum of
its segments' response lengths, K_i steps, its group, its outcome, the judge's labels of its steps and
the facts only training reads (`Rollout`'s fields). The tokens stay in those segments; two padded
views are made from them, each by the code that reads it:

- the estimator's `AdvantageBatch` (`advantage_batch`): one row per rollout, its segments' response
  tokens side by side (`join_segments`), right-padded to T = max_i N_i;
- the update's micro-batches (`trainer.update.collate`): one row per segment.

`estimate` runs the estimator and cuts each rollout's row of advantages back onto its segments
(`split_row`, the inverse of the join, the one both backends use); `samples` are the update's rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel

from common.schemas import StepLabel
from estimators.batch import AdvantageBatch, batch_from_rows, label_values
from estimators.registry import estimate
from estimators.segments import join_segments, split_row
from judge.client import TrajectoryJudgment
from trainer.branches import step_credits
from trainer.rollout import Rollout
from trainer.update import TrainSample


@dataclass
class StepBatch:
    """One step's rollouts with everything the estimator and the update read.

    groups:         the complete task groups, B rollouts in all (a group's rollouts share `group_id`).
    judgments:      the judge's judgment of each judged rollout, by trajectory id (K_i labels each);
                    empty when the estimator needs no step labels.
    exact_logprobs: the generator computed its log-probs with the training model's numerics (the
                    in-process engine), so the update may reuse them as old log-probs.
    advantages:     after `estimate`: per rollout, N_i token advantages (float32 values), 0 on mask-0 tokens.
    """

    groups: list[list[Rollout]]
    judgments: Mapping[str, TrajectoryJudgment] = field(default_factory=dict)
    exact_logprobs: bool = False
    advantages: list[list[float]] | None = None

    @property
    def rollouts(self) -> list[Rollout]:
        """The B rollouts, group by group."""
        return [r for g in self.groups for r in g]

    def labels(self, rollout: Rollout) -> list[StepLabel] | None:
        """The judge's K_i labels of `rollout`'s steps; None when it was not judged."""
        judgment = self.judgments.get(rollout.trajectory.trajectory_id)
        return list(judgment.labels) if judgment is not None else None

    def advantage_batch(self) -> AdvantageBatch:
        """The estimator's input: B rows, T = max_i N_i columns.

        response_mask (B, T) float32, step_ids (B, T) long (-1: padding or no step), outcome (B,) float32;
        per row: group key, K_i label values (when judged), anchor keys, step rewards and the K_i step credits of
        a rollout whose ask a paired branch credited (`trainer.branches.step_credits`).
        """
        rollouts = self.rollouts
        return batch_from_rows(
            [r.trajectory for r in rollouts],
            loss_masks=[join_segments([s.loss_mask for s in r.segments]) for r in rollouts],
            step_ids=[join_segments([s.step_ids for s in r.segments]) for r in rollouts],
            labels=[label_values(self.labels(r), len(r.trajectory.steps), r.trajectory.trajectory_id)
                    for r in rollouts],
            credits=[step_credits(r.trajectory) for r in rollouts])

    def estimate(self, name: str, config: BaseModel | dict | None, training_step: int) -> dict[str, float]:
        """Run estimator `name` (0-based `training_step`) and keep each rollout's N_i token advantages;
        returns its metrics (`advantage/...`)."""
        result = estimate(name, self.advantage_batch(), config, training_step=training_step)
        rows = result.advantages.tolist()  # (B, T)
        self.advantages = [row[:sum(len(s.response_ids) for s in r.segments)]
                           for row, r in zip(rows, self.rollouts, strict=True)]
        return {f"advantage/{k.removeprefix('adv/')}": v for k, v in result.metrics.items()}

    def samples(self) -> list[TrainSample]:
        """The update's rows, one per segment (S = sum_i S_i), in rollout order: the segment's tokens, its
        advantages, the experience flag, the generator's log-probs and policy version (None when its turns
        straddle versions)."""
        if self.advantages is None:
            raise RuntimeError("the step batch has no advantages yet: call estimate first")
        out: list[TrainSample] = []
        for rollout, advantages in zip(self.rollouts, self.advantages, strict=True):
            lengths = [len(s.response_ids) for s in rollout.segments]
            trajectory = rollout.trajectory
            logprobs = trajectory.logprobs or None
            logprob_parts: Sequence[list[float] | None] = (split_row(logprobs, lengths) if logprobs
                                                           else [None] * len(lengths))
            versions = set(rollout.policy_versions)
            version = versions.pop() if len(versions) == 1 else None
            out += [TrainSample(seg.prompt_ids, seg.response_ids, seg.loss_mask, part, trajectory.experience_flag,
                                rollout_logprobs=seg_logprobs, policy_version=version,
                                logprobs_exact=self.exact_logprobs)
                    for seg, part, seg_logprobs in zip(rollout.segments, split_row(advantages, lengths),
                                                       logprob_parts, strict=True)]
        return out
