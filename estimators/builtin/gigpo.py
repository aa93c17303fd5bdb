"""GiGPO (verl-agent's group-in-group): episode advantage + weighted anchor-state step advantage.

Per task group g:
  E_i      = group normalisation of the outcome R_i (as GRPO, one value per trajectory)
  R_{i,t}  = sum_{k >= t} gamma^(k - t) r_{i,k},  r_{i,k} = the environment's step reward + c_{i,k} (as
             verl-agent: the environments put the final score in the last step's reward already, so adding
             R_i again would count it twice); only a batch without step rewards puts R_i on its last step
  c_{i,k}  = the step's credit (`step_credits`; 0 without): with `ask_reward: paired_branch`, on an asking
             step the outcome with the answer minus the outcome of its branch without it. It moves the
             asking step's return and, discounted, the returns before it; like every return it counts
             through the anchor groups (a step alone in its anchor group gets S = 0)
  S_{i,t}  = R_{i,t} normalised within its anchor group: the steps of group g whose anchor key (the
             state acted in) is equal, across and within trajectories; a singleton anchor group gets 0
  A_{i,t}  = E_i + step_weight * S_{i,t}                    broadcast to the tokens of step t

A task group of one: under `std="verl"` E_i is the raw outcome (mean 0, std 1, as verl-agent), under
`population`/`unbiased` it is 0; its steps are singleton anchor groups, so S_{i,t} = 0 either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from common.config import StrictModel
from estimators.grouping import StdConvention, has_spread, normalize_in_groups
from estimators.result import AdvantageResult, BatchError
from estimators.spec import estimator
from estimators.tokens import broadcast_steps

if TYPE_CHECKING:
    from estimators.batch import AdvantageBatch


class GigpoConfig(StrictModel):
    """verl-agent's GiGPO: episode-level group advantage + weighted anchor-state step advantage."""

    step_weight: float = Field(default=1.0, ge=0, description="weight of the step-level (anchor) advantage")
    gamma: float = Field(default=0.95, ge=0, le=1, description="discount of the per-step returns")
    std: StdConvention = "unbiased"
    normalize_by_std: bool = Field(default=False, description="verl-agent's default mode is mean_norm (False)")
    epsilon: float = Field(default=1e-6, ge=0, description="added to the std in the `verl` convention only")


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    returns = np.zeros_like(rewards)
    running = 0.0
    for t in range(rewards.size - 1, -1, -1):
        running = rewards[t] + gamma * running
        returns[t] = running
    return returns


@estimator("gigpo", GigpoConfig, needs=("anchor_keys",))
def gigpo(batch: AdvantageBatch, config: GigpoConfig, training_step: int) -> AdvantageResult:
    """Reads outcome (B,), step_ids (B, T), per row K_i anchor keys and step rewards; advantages (B, T)
    float32 (A_{i,t} on the tokens of step t, 0 on tokens in no step), step_advantages K_i per row."""
    if batch.anchor_keys is None or any(row is None for row in batch.anchor_keys):
        raise BatchError("gigpo needs anchor_keys (the state each step acted in) for every row")
    groups = batch.groups()
    outcome = batch.outcome.detach().double().cpu().numpy()
    episode = normalize_in_groups(outcome, groups, std=config.std, by_std=config.normalize_by_std,
                                  epsilon=config.epsilon)
    steps = batch.steps_per_row()

    returns: list[np.ndarray] = []
    for i, k in enumerate(steps):
        env_rewards = batch.step_rewards[i] if batch.step_rewards is not None else None
        if env_rewards is not None:
            rewards = np.asarray(env_rewards, dtype=np.float64)
        else:
            rewards = np.zeros(k)
            if k:
                rewards[-1] = outcome[i]
        returns.append(discounted_returns(rewards + batch.credits(i, k), config.gamma))

    # Flatten every (row, step) and group them by (task group, anchor key).
    flat_returns: list[float] = []
    flat_keys: list[tuple[int, str]] = []
    positions: list[tuple[int, int]] = []
    for g, rows in enumerate(groups):
        for i in rows:
            keys = batch.anchor_keys[i]
            for t in range(steps[i]):
                flat_returns.append(float(returns[i][t]))
                flat_keys.append((g, str(keys[t])))
                positions.append((i, t))
    anchor_groups: dict[tuple[int, str], list[int]] = {}
    for n, key in enumerate(flat_keys):
        anchor_groups.setdefault(key, []).append(n)
    values = np.asarray(flat_returns, dtype=np.float64)
    members = list(anchor_groups.values())
    # Anchor groups use the std convention's zero rule for singletons even under `verl`: a state seen
    # once has no relative signal (verl-agent gives it 0 too).
    multi = [m for m in members if len(m) > 1]
    step_norm = normalize_in_groups(values, multi, std=config.std, by_std=config.normalize_by_std,
                                    epsilon=config.epsilon)

    step_advantages = [np.full(k, episode[i]) for i, k in enumerate(steps)]
    for n, (i, t) in enumerate(positions):
        step_advantages[i][t] += config.step_weight * step_norm[n]
    sizes = [len(m) for m in members]
    return AdvantageResult(
        advantages=broadcast_steps(batch, [row.tolist() for row in step_advantages]),
        step_advantages=[row.tolist() for row in step_advantages],
        metrics={"adv/anchor_groups": float(len(members)),
                 "adv/anchor_group_mean_size": float(np.mean(sizes)) if sizes else 0.0,
                 "adv/anchor_groups_with_signal": float(sum(1 for m in multi if has_spread(values[m]))),
                 **batch.credit_metrics()},
    )
