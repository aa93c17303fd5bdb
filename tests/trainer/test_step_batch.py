"""The step batch: the estimator reads its segments joined per rollout and the judge's labels from it, and its
advantages go back onto the segments the update trains, by hand-computed ADCA-GRPO values."""

from __future__ import annotations

import math

import pytest

from common.schemas import ChatMessage, Step, StepLabel, Trajectory
from estimators import AdcaGrpoConfig, BatchError
from judge.client import TrajectoryJudgment
from trainer.rollout import Rollout
from trainer.step_batch import StepBatch
from trainer.templates import Segment


def _rollout(name: str, outcome: float, segments: list[Segment], versions: list[int],
             logprobs: list[float] | None) -> Rollout:
    steps = sorted({s for seg in segments for s in seg.step_ids})
    trajectory = Trajectory(
        trajectory_id=name, task_id="t", group_id="g", outcome=outcome,
        steps=[Step(index=t, action=ChatMessage(role="assistant", content=f"a{t}")) for t in steps],
        prompt_ids=segments[0].prompt_ids, response_ids=[i for s in segments for i in s.response_ids],
        loss_mask=[m for s in segments for m in s.loss_mask], step_ids=[t for s in segments for t in s.step_ids],
        logprobs=logprobs)
    return Rollout(trajectory, segments, policy_versions=versions)


def _judged(name: str, *labels: str) -> TrajectoryJudgment:
    return TrajectoryJudgment(trajectory_id=name, labels=[StepLabel(step=t, label=lab)  # type: ignore[arg-type]
                                                          for t, lab in enumerate(labels)])


def test_advantages_from_the_judges_labels_go_back_onto_each_segment():
    # Rollout a: two steps over two segments (a template that rewrote its context); b: one step.
    a = _rollout("a", 1.0, [Segment([1, 2], [11, 12, 13], [1, 1, 0], [0, 0, 0]), Segment([1, 5], [14, 15], [1, 0], [1, 1])],
                 versions=[3, 3], logprobs=[-0.1, -0.2, 0.0, -0.3, 0.0])
    b = _rollout("b", 0.0, [Segment([1, 2], [21, 22], [1, 0], [0, 0])], versions=[2, 3], logprobs=None)
    batch = StepBatch([[a, b]], {"a": _judged("a", "GOOD", "BAD"), "b": _judged("b", "BAD")})

    metrics = batch.estimate("adca_grpo", AdcaGrpoConfig(alpha=0.5), training_step=0)
    # Labels a = (+1, -1), b = (-1): mu = -0.5, var = 0.75, so z_a = (1.5, -0.5) / sqrt(0.75), z_b = -0.5 / sqrt(0.75);
    # outcomes z-scored (population): +1, -1 on the last step; advantages are suffix sums of 0.5 z + outcome.
    z = 1 / math.sqrt(0.75)
    a0, a1 = 0.5 * 1.5 * z + (0.5 * -0.5 * z + 1), 0.5 * -0.5 * z + 1
    b0 = 0.5 * -0.5 * z - 1
    assert batch.advantages == [pytest.approx([a0, a0, 0, a1, 0], abs=1e-6), pytest.approx([b0, 0], abs=1e-6)]
    assert metrics["advantage/good_label_rate"] == pytest.approx(1 / 3)

    samples = batch.samples()
    assert [s.response_ids for s in samples] == [[11, 12, 13], [14, 15], [21, 22]]
    assert [s.advantages for s in samples] == [pytest.approx([a0, a0, 0], abs=1e-6), pytest.approx([a1, 0], abs=1e-6),
                                              pytest.approx([b0, 0], abs=1e-6)]
    assert [s.rollout_logprobs for s in samples] == [[-0.1, -0.2, 0.0], [-0.3, 0.0], None]
    assert [s.policy_version for s in samples] == [3, 3, None]  # b's turns straddle two versions
    assert a.trajectory.labels is None and b.trajectory.labels is None  # the labels live on the batch


def test_an_estimator_needing_labels_fails_without_them_and_samples_need_advantages():
    a = _rollout("a", 1.0, [Segment([1], [11], [1], [0])], versions=[0], logprobs=None)
    batch = StepBatch([[a]])
    with pytest.raises(RuntimeError, match="call estimate first"):
        batch.samples()
    with pytest.raises(BatchError, match="needs step_labels"):
        batch.estimate("adca_grpo", None, training_step=0)
