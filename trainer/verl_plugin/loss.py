"""Our policy loss (PPO clip, dual clip, selective boosting) inside veRL, with the math of `trainer.loss`.

Two pieces:
- `evolver_boosted`, registered with `register_policy_loss`: veRL's 7-argument policy-loss hook.
  The per-token math is `trainer.loss.policy_loss`; the reduction is veRL's `agg_loss` (token-mean,
  seq-mean-..., with `global_batch_info`), so the loss stays invariant to data parallelism and
  micro-batching exactly like veRL's own losses.
- `evolver_ppo_loss`, for `ActorRolloutRefWorker.set_loss_fn`: veRL's policy-loss hook sees no
  per-sample field, so this wrapper reads the experience flag from the micro-batch and runs veRL's
  own `ppo_loss` (entropy, KL, metric aggregation unchanged) with the flag visible to
  `evolver_boosted` for the duration of the call (a context variable: the only channel between the
  two that does not mean copying veRL's `ppo_loss`).
Without a flag (plain `ppo_loss`, or `loss_mode=evolver_boosted` alone) nothing is boosted.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any

import torch

from trainer.loss import PolicyLossConfig, policy_loss

# The per-sample field our trainer writes next to the advantages: 1.0 where the rollout saw experience.
EXPERIENCE_FLAG_FIELD = "experience_flag"  # the one name of the experience bit, end to end


@dataclass(frozen=True)
class _Boost:
    flag: torch.Tensor  # (B,) bool, rows of the micro-batch
    clip_high_boosted: float


_BOOST: contextvars.ContextVar[_Boost | None] = contextvars.ContextVar("evolver_boost", default=None)


def _setting(config: Any, key: str, default: Any = None) -> Any:
    if config is None:
        return default
    getter = getattr(config, "get", None)
    value = getter(key, default) if callable(getter) else getattr(config, key, default)
    return default if value is None else value


def loss_config_from_actor(config: Any, clip_high_boosted: float = 0.6) -> PolicyLossConfig:
    """Our loss settings from veRL's actor config (clip_ratio[_low|_high], clip_ratio_c).

    KL and entropy stay 0 here: veRL's `ppo_loss` adds them from its own settings.
    """
    clip = float(_setting(config, "clip_ratio", 0.2))
    return PolicyLossConfig(clip_low=float(_setting(config, "clip_ratio_low", clip)),
                            clip_high=float(_setting(config, "clip_ratio_high", clip)),
                            clip_high_boosted=clip_high_boosted,
                            dual_clip_c=float(_setting(config, "clip_ratio_c", 3.0)))


def aggregation_weights(mask: torch.Tensor, loss_agg_mode: str, dp_size: int = 1, batch_num_tokens: Any = None,
                        global_batch_size: Any = None, loss_scale_factor: Any = None, **_other: Any) -> torch.Tensor:
    """Per-token weights w with sum(loss_mat * w) == veRL's agg_loss(loss_mat, mask, loss_agg_mode, ...)."""
    m = mask.to(torch.float32)
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
            batch_num_tokens = m.sum().clamp(min=1.0)
        return m * dp_size / batch_num_tokens
    if loss_agg_mode == "token-sum":
        return m * dp_size
    if loss_agg_mode not in ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")
    tokens_per_row = m.sum(dim=-1, keepdim=True)
    if global_batch_size is None:
        if dp_size > 1:
            raise ValueError("global_batch_size is required when dp_size > 1")
        global_batch_size = (tokens_per_row > 0).to(torch.float32).sum()
    weights = m * dp_size / global_batch_size
    if loss_agg_mode == "seq-mean-token-mean":
        weights = weights / (tokens_per_row + 1e-8)
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        weights = weights / (loss_scale_factor if loss_scale_factor is not None else m.shape[-1])
    return weights


def boosted_policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                        response_mask: torch.Tensor, loss_agg_mode: str, config: Any,
                        rollout_is_weights: torch.Tensor | None = None, experience_flag: torch.Tensor | None = None,
                        clip_high_boosted: float = 0.6) -> tuple[torch.Tensor, dict[str, float]]:
    """`trainer.loss.policy_loss` per token, reduced as veRL reduces (see `aggregation_weights`)."""
    weights = aggregation_weights(response_mask, loss_agg_mode, **(_setting(config, "global_batch_info", {}) or {}))
    if rollout_is_weights is not None:
        weights = weights * rollout_is_weights.to(weights.dtype)
    weights = weights.to(log_prob.device)
    total = weights.sum()
    # policy_loss takes a token-mean over its `mask`, i.e. sum(pg * w) / max(sum(w), 1). Scaling the
    # weights to sum to the local token count keeps that denominator exact (never clamped) and its
    # metrics proper weighted means; multiplying the mean back by `total` gives sum(pg * weights).
    tokens = response_mask.to(torch.float32).sum().clamp(min=1.0).to(log_prob.device)
    relative = torch.where(total > 0, weights * (tokens / total.clamp(min=1e-30)), weights)
    cfg = loss_config_from_actor(config, clip_high_boosted)
    mean, metrics = policy_loss(log_prob, old_log_prob, advantages, relative, experience_flag, cfg)
    loss = mean * total
    return loss, {f"actor/{key}": value for key, value in metrics.items()}


def evolver_boosted(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                    response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config: Any = None,
                    rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """veRL's policy-loss signature. Boosts flagged rows only inside `evolver_ppo_loss` (see module doc)."""
    boost = _BOOST.get()
    flag = boost.flag.to(log_prob.device) if boost is not None else None
    if flag is not None and flag.shape[0] != log_prob.shape[0]:
        raise ValueError(f"experience flag has {flag.shape[0]} rows but the micro-batch has {log_prob.shape[0]}")
    return boosted_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                               rollout_is_weights, flag, boost.clip_high_boosted if boost is not None else 0.6)


def experience_flag_from(data: Any) -> torch.Tensor:
    """The (B,) bool experience flag of a micro-batch TensorDict: our tensor field, else `extra_fields`."""
    keys = set(data.keys())
    if EXPERIENCE_FLAG_FIELD in keys:
        value = data[EXPERIENCE_FLAG_FIELD]
        if getattr(value, "is_nested", False):
            value = value.to_padded_tensor(0.0)
        return torch.as_tensor(value).reshape(len(value), -1)[:, 0].bool()
    if "extra_fields" in keys:
        extras = data["extra_fields"]
        rows = extras.tolist() if hasattr(extras, "tolist") else list(extras)
        if all(isinstance(r, dict) and "experience_flag" in r for r in rows):
            return torch.tensor([bool(r["experience_flag"]) for r in rows])
    raise KeyError(f"the micro-batch has neither {EXPERIENCE_FLAG_FIELD!r} nor extra_fields['experience_flag']: "
                   "train with trainer.v1.trainer_mode=evolver_sync and the evolver_env_agent agent loop")


def evolver_ppo_loss(config: Any, model_output: Any, data: Any, dp_group: Any = None, *,
                     clip_high_boosted: float = 0.6) -> tuple[torch.Tensor, dict[str, Any]]:
    """For `set_loss_fn`: veRL's `ppo_loss` with `evolver_boosted` seeing the micro-batch's experience flag."""
    from verl.workers.utils.losses import ppo_loss

    mode = _setting(_setting(config, "policy_loss", {}), "loss_mode", "vanilla")
    if mode != "evolver_boosted":
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.loss_mode={mode!r}: the experience-aware loss "
                         "needs loss_mode=evolver_boosted")
    token = _BOOST.set(_Boost(experience_flag_from(data), clip_high_boosted))
    try:
        return ppo_loss(config, model_output, data, dp_group)
    finally:
        _BOOST.reset(token)
