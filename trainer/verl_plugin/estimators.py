"""Our advantage estimators behind veRL's `register_adv_est` signature, and the trainer's advantage step.

veRL calls a registered estimator as `fn(token_level_rewards, response_mask, config, index, ...)`
and returns `(advantages, returns)`. Our wrappers build an `AdvantageBatch` from exactly that
(`AdvantageBatch.from_token_rewards`) and run the same `estimators` code the local trainer
runs. Stock veRL never passes step ids or labels, so `evolver_adca_grpo` and `evolver_gigpo` need
the `evolver_sync` trainer, which calls `compute_evolver_advantage` with the agent loop's per-sample
fields; called without them they fail with a message saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from estimators import AdvantageBatch, BatchError, catalog, estimate
from estimators.segments import join_segments, split_row
from trainer.verl_plugin.settings import advantage_settings

# Per-sample fields the agent loop puts in `extra_fields` (veRL's non_tensor_batch).
STEP_FIELDS = ("step_ids", "step_labels", "anchor_keys", "step_rewards", "num_steps", "trajectory_id", "segment_index")


def _check_norm_flag(name: str, settings: Any, algorithm_config: Any) -> None:
    """veRL's own `norm_adv_by_std_in_grpo` must agree with ours: two switches for one thing is a trap."""
    if name != "grpo" or algorithm_config is None:
        return
    getter = getattr(algorithm_config, "get", None)
    verl_flag = getter("norm_adv_by_std_in_grpo", None) if callable(getter) else None
    if verl_flag is not None and bool(verl_flag) != settings.grpo.normalize_by_std:
        raise ValueError(f"algorithm.norm_adv_by_std_in_grpo={verl_flag} contradicts "
                         f"algorithm.evolver.grpo.normalize_by_std={settings.grpo.normalize_by_std}; set both alike")


def make_verl_estimator(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """A veRL-signature estimator running our estimator `name` (settings from `algorithm.evolver`).

    token_level_rewards (B, T), response_mask (B, T), index (B,) group uids; optional step_ids (B, T) and per
    row K_i step_labels / anchor_keys / step_rewards. Returns (advantages, returns), each (B, T).
    """

    def estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Sequence | None = None,
                  config: Any = None, *, step_ids: torch.Tensor | None = None, training_step: int = 0,
                  step_labels: Sequence | None = None, anchor_keys: Sequence | None = None,
                  step_rewards: Sequence | None = None, num_steps: Sequence[int] | None = None,
                  **unused: Any) -> tuple[torch.Tensor, torch.Tensor]:
        # `unused`: what veRL passes other estimators (reward_baselines, ...); ours do not read it.
        if index is None:
            raise BatchError(f"{catalog.verl_name(name)} needs the group index (data.non_tensor_batch['uid'])")
        settings = advantage_settings(config)
        _check_norm_flag(name, settings, config)
        batch = AdvantageBatch.from_token_rewards(
            token_level_rewards, response_mask, index, step_ids=step_ids, step_labels=step_labels,
            anchor_keys=anchor_keys, step_rewards=step_rewards, num_steps=num_steps)
        try:
            result = estimate(name, batch, settings.config_for(name), training_step=training_step)
        except BatchError as exc:
            if step_ids is None and name != "grpo":
                raise BatchError(f"{catalog.verl_name(name)}: {exc}. veRL's stock advantage step passes no step "
                                 f"ids or labels; run with trainer.v1.trainer_mode=evolver_sync") from exc
            raise
        advantages = result.advantages.to(device=token_level_rewards.device, dtype=token_level_rewards.dtype)
        return advantages, advantages.clone()

    estimator.__name__ = f"compute_{catalog.verl_name(name)}_advantage"
    estimator.__qualname__ = estimator.__name__
    return estimator


def estimator_name(verl_name: str) -> str | None:
    """Our estimator behind a veRL `adv_estimator` name, or None when it is not one of ours."""
    return catalog.from_verl_name(verl_name)


# ---------------------------------------------------------------- the trainer's advantage step

def _column(non_tensor: dict[str, np.ndarray], key: str, rows: int) -> list[Any] | None:
    if key not in non_tensor:
        return None
    values = list(non_tensor[key])
    if len(values) != rows:
        raise BatchError(f"non_tensor_batch[{key!r}] has {len(values)} entries for {rows} rows")
    return values


def _trajectories(non_tensor: dict[str, np.ndarray], rows: int) -> list[list[int]]:
    """Rows grouped by trajectory, each in segment order (a template that rewrites its context makes
    several training rows per trajectory). Without `trajectory_id`, each row is its own trajectory."""
    ids = _column(non_tensor, "trajectory_id", rows)
    if ids is None:
        return [[r] for r in range(rows)]
    segments = _column(non_tensor, "segment_index", rows) or [0] * rows
    by_id: dict[Any, list[int]] = {}
    for row, tid in enumerate(ids):
        by_id.setdefault(tid, []).append(row)
    return [sorted(members, key=lambda r: int(segments[r])) for members in by_id.values()]


def compute_evolver_advantage(data: Any, verl_name: str, algorithm_config: Any, *, training_step: int = 0
                              ) -> dict[str, float]:
    """Set `advantages` and `returns` on a veRL `DataProto` with our estimator, using step ids and labels.

    Reads `token_level_rewards`, `response_mask` and `non_tensor_batch['uid']`, and where present the
    per-row fields the agent loop emits (`step_ids`, `step_labels`, `anchor_keys`, `step_rewards`,
    `num_steps`, `trajectory_id`, `segment_index`). Segments of one trajectory are joined into one
    estimator row (outcome = the reward on its last segment) and the advantages split back.
    """
    name = estimator_name(verl_name)
    if name is None:
        raise ValueError(f"{verl_name!r} is not an evolver estimator; ours: "
                         f"{', '.join(catalog.verl_name(n) for n in catalog.names())}")
    rewards: torch.Tensor = data.batch["token_level_rewards"]
    mask: torch.Tensor = data.batch["response_mask"]
    non_tensor = data.non_tensor_batch
    rows, width = mask.shape
    if "uid" not in non_tensor:
        raise BatchError("the batch has no non_tensor_batch['uid'] (the GRPO group of each row)")
    trajectories = _trajectories(non_tensor, rows)
    step_ids_col = _column(non_tensor, "step_ids", rows)

    # One estimator row per trajectory: its segments' response tokens side by side (`join_segments`).
    spans = [[_valid_length(mask[r], step_ids_col, r) for r in members] for members in trajectories]
    joined_width = max(sum(span) for span in spans) if spans else 0
    joined_mask = torch.zeros((len(trajectories), joined_width), dtype=mask.dtype)
    joined_steps = torch.full((len(trajectories), joined_width), -1, dtype=torch.long)
    outcome = torch.zeros((len(trajectories), 1), dtype=rewards.dtype)
    for t, members in enumerate(trajectories):
        row_mask = join_segments([mask[r, :n].cpu().tolist() for r, n in zip(members, spans[t], strict=True)])
        joined_mask[t, :len(row_mask)] = torch.as_tensor(row_mask, dtype=mask.dtype)
        if step_ids_col is not None:
            row_steps = join_segments([list(step_ids_col[r])[:n] for r, n in zip(members, spans[t], strict=True)])
            joined_steps[t, :len(row_steps)] = torch.as_tensor(row_steps, dtype=torch.long)
        outcome[t, 0] = rewards[members[-1]].sum().cpu()

    per_row: dict[str, Any] = {}  # per trajectory: the same on each of its segments, read from the last
    for key in ("step_labels", "anchor_keys", "step_rewards"):
        column = _column(non_tensor, key, rows)
        if column is not None:
            per_row[key] = [_as_list(column[members[-1]]) for members in trajectories]
    num_steps = _column(non_tensor, "num_steps", rows)
    if num_steps is not None:
        per_row["num_steps"] = [int(num_steps[members[-1]]) for members in trajectories]
    if "step_labels" in per_row and all(v is None for v in per_row["step_labels"]):
        per_row["step_labels"] = None
    index = [non_tensor["uid"][members[0]] for members in trajectories]
    estimator = make_verl_estimator(name)
    joined_adv, _ = estimator(outcome, joined_mask, index, algorithm_config,
                              step_ids=joined_steps if step_ids_col is not None else None,
                              training_step=training_step, **per_row)

    advantages = torch.zeros((rows, width), dtype=torch.float32)
    for t, members in enumerate(trajectories):
        parts = split_row(joined_adv[t].tolist(), spans[t])  # back onto the segments (`split_row`)
        for r, part in zip(members, parts, strict=True):
            advantages[r, :len(part)] = torch.as_tensor(part, dtype=torch.float32)
    advantages = advantages.to(mask.device) * mask.to(torch.float32)
    data.batch["advantages"] = advantages
    data.batch["returns"] = advantages.clone()
    return {"evolver/trajectories": float(len(trajectories)), "evolver/rows": float(rows)}


def _valid_length(mask_row: torch.Tensor, step_ids_col: list | None, row: int) -> int:
    """Response tokens of a row: the length of its step-id list, else up to its last mask-1 token."""
    if step_ids_col is not None:
        return min(len(list(step_ids_col[row])), int(mask_row.shape[0]))
    nonzero = mask_row.nonzero()
    return int(nonzero[-1]) + 1 if nonzero.numel() else 0


def _as_list(value: Any) -> list | None:
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return value.tolist()
    return list(value)
