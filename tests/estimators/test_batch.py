"""Converting `Trajectory` objects into the estimators' batch."""

from __future__ import annotations

import pytest
import torch

from common.schemas import ChatMessage, Step, StepLabel, Trajectory
from estimators import (
    AdvantageBatch,
    BatchError,
    anchor_keys_for,
    batch_from_trajectories,
    compute_advantages,
)


def step(index: int, action: str, observation: str | None = None, state_hash: str | None = None,
         reward: float = 0.0) -> Step:
    return Step(index=index, action=ChatMessage(role="assistant", content=action), reward=reward,
                observation=ChatMessage(role="tool", content=observation) if observation is not None else None,
                state_hash=state_hash)


def traj(tid: str, steps: list[Step], outcome: float | None = 1.0, **kw) -> Trajectory:
    n = 2 * len(steps)
    return Trajectory(trajectory_id=tid, task_id="task", steps=steps, outcome=outcome,
                      response_ids=list(range(n)), loss_mask=[1, 0] * len(steps),
                      step_ids=[s for s in range(len(steps)) for _ in (0, 1)], **kw)


def test_padding_groups_labels_and_rewards():
    a = traj("a", [step(0, "x", "o1", reward=0.5), step(1, "y")], group_id="g",
             labels=[StepLabel(step=1, label="BAD"), StepLabel(step=0, label="GOOD")])
    b = traj("b", [step(0, "x")], outcome=0.0, labels=[StepLabel(step=0, label="BAD")])
    batch = batch_from_trajectories([a, b], pad_to=6)
    assert batch.response_mask.tolist() == [[1, 0, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]]
    assert batch.step_ids.tolist() == [[0, 0, 1, 1, -1, -1], [0, 0, -1, -1, -1, -1]]
    assert batch.outcome.tolist() == [1.0, 0.0]
    assert batch.group_index == ["g", "task"]  # group_id, else task_id
    assert batch.step_labels == [[1.0, -1.0], [-1.0]]  # ordered by step index
    assert batch.step_rewards == [[0.5, 0.0], [0.0]]
    assert batch.num_steps == [2, 1]


def test_anchor_keys_prefer_state_hash_then_previous_observation():
    t1 = traj("1", [step(0, "look", "You see  a door."), step(1, "open", "It opens"), step(2, "go", state_hash="h9")])
    t2 = traj("2", [step(0, "peek", "You see a door. "), step(1, "kick")])
    k1, k2 = anchor_keys_for(t1), anchor_keys_for(t2)
    assert k1[0] == k2[0] == "initial"  # every rollout of a task starts in its initial state
    assert k1[1] == k2[1]  # same observation up to whitespace: same anchor state
    assert k1[2] == "state:h9"
    # used by gigpo: both step 1s land in one anchor group (2 groups of 2 and one singleton)
    result = compute_advantages("gigpo", batch_from_trajectories([t1, t2]))
    assert torch.isfinite(result).all()


def test_errors_name_the_trajectory():
    with pytest.raises(BatchError, match="empty"):
        batch_from_trajectories([])
    with pytest.raises(BatchError, match="trajectory nooutcome .* has no outcome"):
        batch_from_trajectories([traj("nooutcome", [step(0, "x")], outcome=None)])
    bad_labels = traj("lab", [step(0, "x"), step(1, "y")], labels=[StepLabel(step=0, label="GOOD")])
    with pytest.raises(BatchError, match=r"trajectory lab: labels must give exactly one label per step .*missing \[1\]"):
        batch_from_trajectories([bad_labels])
    nomask = Trajectory(trajectory_id="nm", task_id="t", outcome=1.0, response_ids=[1, 2])
    with pytest.raises(BatchError, match="nm .* no loss_mask"):
        batch_from_trajectories([nomask])
    with pytest.raises(BatchError, match="pad_to=1 is shorter"):
        batch_from_trajectories([traj("p", [step(0, "x")])], pad_to=1)


def test_from_token_rewards_sums_rewards_per_row():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.5, 0.5]])
    batch = AdvantageBatch.from_token_rewards(rewards, torch.ones(3, 2), ["u", "u", "v"])
    assert batch.outcome.tolist() == [1.0, 0.0, 1.0]
    assert (batch.step_ids == -1).all()
    # group u: 1, 0 -> unbiased std sqrt(0.5): +-0.5/sqrt(0.5); group v alone -> 0
    want = 0.5 / 0.5 ** 0.5
    assert torch.allclose(compute_advantages("grpo", batch)[:, 0], torch.tensor([want, -want, 0.0]))
