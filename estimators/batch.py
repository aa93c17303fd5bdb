"""The group-structured batch every estimator takes, and its conversion from `Trajectory` objects.

Rows are trajectories (rollouts); columns are response tokens, right-padded. A row's steps are
numbered 0..K-1 and its tokens point at them through `step_ids` (-1: the token is in no step).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from common.schemas import StepLabel, Trajectory
from estimators.result import BatchError


@dataclass
class AdvantageBatch:
    """Inputs of an estimator. Shapes: B rows (trajectories), T response tokens, K_i steps in row i.

    response_mask: (B, T) 1 on policy tokens (bool, int or float).
    step_ids:      (B, T) integer step index of each token, -1 where a token belongs to no step.
    outcome:       (B,) final reward of each trajectory.
    group_index:   (B,) task-group key per row (tensor, ndarray or list of hashables: ints, uid strings).
    step_labels:   per row a sequence of K_i step labels (GOOD=+1, BAD=-1, any positive/negative scale),
                   or None for a row without labels. Needed by `adca_grpo`.
    anchor_keys:   per row K_i anchor-state keys (the state before step t). Needed by `gigpo`.
    step_rewards:  per row K_i environment rewards per step (`gigpo` returns; default 0).
    step_credits:  per row K_i credits c_{i,t} added to step t's reward by the step-level estimators (`adca_grpo`,
                   `gigpo`), or None for a row without: the paired-branch credit of an ask (the outcome with the
                   answer minus without it, on the asking step; `trainer.experience.ask_reward`).
    num_steps:     (B,) K_i; default: len(step_labels[i]), else max(step_ids[i]) + 1.
    """

    response_mask: torch.Tensor
    step_ids: torch.Tensor
    outcome: torch.Tensor
    group_index: Sequence[Hashable] | torch.Tensor | np.ndarray
    step_labels: Sequence[Sequence[float] | None] | None = None
    anchor_keys: Sequence[Sequence[str] | None] | None = None
    step_rewards: Sequence[Sequence[float] | None] | None = None
    step_credits: Sequence[Sequence[float] | None] | None = None
    num_steps: Sequence[int] | None = None

    @classmethod
    def from_token_rewards(cls, token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                           index: Sequence[Hashable] | np.ndarray, step_ids: torch.Tensor | None = None,
                           **per_row: Sequence | None) -> AdvantageBatch:
        """A batch in veRL's terms: outcome = the row sum of the token rewards, groups = `index` (uids).

        Without `step_ids` every token is in no step (enough for `grpo`); `per_row` passes
        step_labels / anchor_keys / step_rewards / num_steps through.
        """
        ids = step_ids if step_ids is not None else torch.full_like(response_mask, -1, dtype=torch.long)
        return cls(response_mask=response_mask, step_ids=ids, outcome=token_level_rewards.sum(dim=-1),
                   group_index=index, **per_row)

    @property
    def size(self) -> int:
        return int(self.response_mask.shape[0])

    def validate(self) -> None:
        """Check shapes and values; raise BatchError naming what to fix."""
        if self.response_mask.dim() != 2:
            raise BatchError(f"response_mask must be (B, T), got shape {tuple(self.response_mask.shape)}")
        if tuple(self.step_ids.shape) != tuple(self.response_mask.shape):
            raise BatchError(f"step_ids has shape {tuple(self.step_ids.shape)} but response_mask has "
                             f"{tuple(self.response_mask.shape)}")
        if self.step_ids.dtype.is_floating_point or self.step_ids.dtype == torch.bool:
            raise BatchError(f"step_ids must be an integer tensor, got {self.step_ids.dtype}")
        if self.step_ids.numel() and int(self.step_ids.min()) < -1:
            raise BatchError("step_ids must be >= -1 (-1 marks a token in no step)")
        b = self.size
        if tuple(self.outcome.shape) != (b,):
            raise BatchError(f"outcome must have shape ({b},), got {tuple(self.outcome.shape)}")
        bad = (~torch.isfinite(self.outcome.double())).nonzero().flatten().tolist()
        if bad:
            raise BatchError(f"outcome is not finite in rows {bad}")
        if len(self.group_index) != b:
            raise BatchError(f"group_index has {len(self.group_index)} entries for {b} rows")
        for name in ("step_labels", "anchor_keys", "step_rewards", "step_credits"):
            rows = getattr(self, name)
            if rows is not None and len(rows) != b:
                raise BatchError(f"{name} has {len(rows)} rows for a batch of {b}")
        if self.num_steps is not None and len(self.num_steps) != b:
            raise BatchError(f"num_steps has {len(self.num_steps)} entries for {b} rows")
        steps = self.steps_per_row()
        max_ids = self._max_step_id_per_row()
        for i in range(b):
            if max_ids[i] >= steps[i]:
                raise BatchError(f"row {i}: a token has step id {max_ids[i]} but the row has {steps[i]} steps")
            for name in ("step_labels", "anchor_keys", "step_rewards", "step_credits"):
                rows = getattr(self, name)
                if rows is not None and rows[i] is not None and len(rows[i]) != steps[i]:
                    raise BatchError(f"row {i}: {name} has {len(rows[i])} entries but the row has {steps[i]} steps")
            for name in ("step_labels", "step_rewards", "step_credits"):
                rows = getattr(self, name)
                if rows is not None and rows[i] is not None and not all(math.isfinite(v) for v in rows[i]):
                    raise BatchError(f"row {i}: {name} has a non-finite value")

    def _max_step_id_per_row(self) -> list[int]:
        if self.step_ids.shape[1] == 0:
            return [-1] * self.size
        return self.step_ids.max(dim=1).values.tolist()

    def steps_per_row(self) -> list[int]:
        """K_i for each row: num_steps, else the label count, else the largest step id + 1."""
        if self.num_steps is not None:
            return [int(k) for k in self.num_steps]
        max_ids = self._max_step_id_per_row()
        if self.step_labels is None:
            return [m + 1 for m in max_ids]
        return [len(lab) if lab is not None else m + 1 for lab, m in zip(self.step_labels, max_ids, strict=True)]

    def group_keys(self) -> list[Hashable]:
        index = self.group_index
        if isinstance(index, torch.Tensor):
            return index.tolist()
        if isinstance(index, np.ndarray):
            return index.tolist()
        return list(index)

    def credits(self, row: int, steps: int) -> np.ndarray:
        """Row `row`'s K_i step credits c_{i,t} (zeros when the batch or the row has none)."""
        values = self.step_credits[row] if self.step_credits is not None else None
        return np.zeros(steps) if values is None else np.asarray(values, dtype=np.float64)

    def credit_metrics(self) -> dict[str, float]:
        """`adv/credited_steps`: steps whose credit is not 0 (the asks whose branch credit entered the
        advantages); nothing for a batch without credits."""
        if self.step_credits is None:
            return {}
        return {"adv/credited_steps": float(sum(int(np.count_nonzero(row)) for row in self.step_credits
                                                if row is not None))}

    def groups(self) -> list[list[int]]:
        """Row indices of each task group, in order of first appearance."""
        by_key: dict[Hashable, list[int]] = {}
        for row, key in enumerate(self.group_keys()):
            by_key.setdefault(key, []).append(row)
        return list(by_key.values())


# ---------------------------------------------------------------- from trajectories

_WHITESPACE = re.compile(r"\s+")


def normalize_observation(text: str) -> str:
    """Observation text as an anchor: whitespace collapsed; case kept (it can matter to the state)."""
    return _WHITESPACE.sub(" ", text).strip()


def anchor_keys_for(trajectory: Trajectory) -> list[str]:
    """The anchor state of each step: the state the agent acted in.

    The environment's canonical `state_hash` (state before the action) where it has one; else the
    normalised text of the observation the agent saw before acting. Step 0 acts in the task's initial
    state, which every rollout of a task group shares.
    """
    keys: list[str] = []
    for t, step in enumerate(trajectory.steps):
        if step.state_hash is not None:
            keys.append(f"state:{step.state_hash}")
        elif t == 0:
            keys.append("initial")
        else:
            previous = trajectory.steps[t - 1].observation
            text = normalize_observation(previous.text() if previous is not None else "")
            keys.append("obs:" + hashlib.sha1(text.encode()).hexdigest())
    return keys


def label_values(labels: Sequence[StepLabel] | None, steps: int, trajectory_id: str = "") -> list[float] | None:
    """The judge's labels of a trajectory of `steps` steps as one value per step 0..K-1 (None: not judged).

    The only label -> value conversion: both backends use it, and it is strict (exactly one label
    per step), so a partial judgment fails here instead of shifting labels onto the wrong steps.
    """
    if labels is None:
        return None
    k = steps
    by_step = {lab.step: lab.value for lab in labels}
    missing = [t for t in range(k) if t not in by_step]
    extra = sorted(s for s in by_step if s >= k)
    if missing or extra or len(labels) != k:
        raise BatchError(f"trajectory {trajectory_id}: labels must give exactly one label per step "
                         f"0..{k - 1} (missing {missing}, beyond the last step {extra}, "
                         f"{len(labels)} labels for {k} steps)")
    return [by_step[t] for t in range(k)]


def batch_from_trajectories(trajectories: Sequence[Trajectory], *, pad_to: int | None = None,
                            device: torch.device | str | None = None) -> AdvantageBatch:
    """Build an AdvantageBatch from trajectories (right-padded to the longest response or `pad_to`).

    Group key: `group_id`, else `task_id`. A trajectory without step ids gets -1 on every token (it
    then only works with `grpo`). Labels, anchors and step rewards come from `labels` and `steps`.
    """
    for row, traj in enumerate(trajectories):
        if traj.response_ids and not traj.loss_mask:
            raise BatchError(f"trajectory {traj.trajectory_id} (row {row}) has {len(traj.response_ids)} response "
                             "tokens but no loss_mask; the rollout must record which tokens the policy generated")
    return batch_from_rows(trajectories, loss_masks=[t.loss_mask for t in trajectories],
                           step_ids=[t.step_ids for t in trajectories],
                           labels=[label_values(t.labels, len(t.steps), t.trajectory_id) for t in trajectories],
                           pad_to=pad_to, device=device)


def batch_from_rows(trajectories: Sequence[Trajectory], *, loss_masks: Sequence[Sequence[int]],
                    step_ids: Sequence[Sequence[int]], labels: Sequence[list[float] | None],
                    credits: Sequence[list[float] | None] | None = None,
                    pad_to: int | None = None, device: torch.device | str | None = None) -> AdvantageBatch:
    """An AdvantageBatch of B rows, right-padded to T = the longest row (or `pad_to`).

    Per row i: `loss_masks[i]` and `step_ids[i]` (N_i response tokens each; no step ids: -1 on every
    token), `labels[i]` (K_i label values or None), `credits[i]` (K_i step credits or None) and, from
    `trajectories[i]`, the outcome, the group key (`group_id`, else `task_id`), the anchor keys and step
    rewards of its K_i steps.
    """
    if not trajectories:
        raise BatchError("no trajectories: the batch is empty")
    longest = max(len(m) for m in loss_masks)
    width = longest if pad_to is None else pad_to
    if width < longest:
        raise BatchError(f"pad_to={pad_to} is shorter than the longest response ({longest} tokens)")
    b = len(trajectories)
    mask = torch.zeros((b, width), dtype=torch.float32)
    ids = torch.full((b, width), -1, dtype=torch.long)
    outcome = torch.zeros(b, dtype=torch.float32)
    for row, traj in enumerate(trajectories):
        n = len(loss_masks[row])
        if traj.outcome is None:
            raise BatchError(f"trajectory {traj.trajectory_id} (row {row}) has no outcome; grade it first")
        outcome[row] = traj.outcome
        if n:
            mask[row, :n] = torch.tensor(loss_masks[row], dtype=torch.float32)
            if step_ids[row]:
                ids[row, :n] = torch.tensor(step_ids[row], dtype=torch.long)
    batch = AdvantageBatch(
        response_mask=mask.to(device) if device is not None else mask,
        step_ids=ids.to(device) if device is not None else ids,
        outcome=outcome.to(device) if device is not None else outcome,
        group_index=[t.group_id or t.task_id for t in trajectories],
        step_labels=list(labels) if any(lab is not None for lab in labels) else None,
        anchor_keys=[anchor_keys_for(t) for t in trajectories],
        step_rewards=[[s.reward for s in t.steps] for t in trajectories],
        step_credits=list(credits) if credits is not None and any(c is not None for c in credits) else None,
        num_steps=[len(t.steps) for t in trajectories],
    )
    for row, traj in enumerate(trajectories):
        for t, step in enumerate(traj.steps):
            if step.index != t:
                raise BatchError(f"trajectory {traj.trajectory_id} (row {row}): steps[{t}] has index {step.index}; "
                                 "steps must be numbered 0..K-1 in order")
    batch.validate()
    return batch
