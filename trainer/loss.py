"""The policy loss: PPO clip with dual clip and selective boosting, KL and entropy terms.

Pure torch, no veRL import: the local trainer and the veRL plugin call the same function.
Selective boosting (AgentEvolver's self-navigating): a sample that saw injected experience and has
a positive advantage may move further from the policy that generated it, so its upper clip bound
is `clip_high_boosted` (0.6) instead of `clip_high` (0.28).

Off-policy samples (rollout/update overlap, `trainer.overlap`) follow decoupled PPO: the ratio is taken
against the proximal policy (the old log-probs the updater recomputes with the current weights), and
each token's clipped objective is multiplied by `weights`, the truncated importance weight
min(pi_prox / mu, cap) of the proximal policy against the behaviour policy mu that generated it
(`behaviour_weights`). On-policy tokens have weight 1.
"""

from __future__ import annotations

import torch

from trainer.settings import PolicyLossConfig


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean over the mask; 0 when the mask is empty (never NaN)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def low_var_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1, clamped for stability."""
    log_ratio = (ref_logp - logp).clamp(-20.0, 20.0)
    return (log_ratio.exp() - log_ratio - 1.0).clamp(-10.0, 10.0)


def gradient_is_zero(advantages: torch.Tensor, mask: torch.Tensor, *, kl_coef: float, entropy_coef: float,
                     at_reference: bool = False) -> bool:
    """Whether `policy_loss` has a zero gradient on this batch, whatever the log-probs: every trained token's
    advantage is 0 (the clipped objective is -A times a ratio, dual clip included), no entropy term is on, and
    no KL term is on or the policy still is its reference (`at_reference`: k3's gradient per token,
    (1 - exp(ref - logp)) * grad logp, is 0 where logp = ref; two forward paths may round it to ~1e-7).
    The update can then be skipped (both backends do)."""
    return ((kl_coef <= 0 or at_reference) and entropy_coef == 0
            and not bool((advantages[mask > 0] != 0).any()))


def behaviour_weights(prox_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
                      cap: float) -> torch.Tensor:
    """Per token min(exp(prox - behaviour), cap) on the mask, 1 elsewhere; no gradient flows through it.

    The cap bounds the variance a token the behaviour policy found unlikely (mu small) would add;
    tokens with pi_prox < mu are weighted down without a floor, as in truncated importance sampling.
    """
    ratio = torch.exp((prox_logp - behaviour_logp).clamp(-20.0, 20.0)).clamp(max=cap)
    return torch.where(mask > 0, ratio, torch.ones_like(ratio)).detach()


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    experience_flag: torch.Tensor | None,
    config: PolicyLossConfig,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean PPO loss over `mask` (B, T). `experience_flag` is (B,) bool: the sample saw experience.
    `weights` (B, T): the behaviour importance weights of off-policy tokens (None: all 1).

    Returns the scalar loss and metrics, with clip fractions reported separately for flagged and
    unflagged samples so the effect of the boosted bound can be watched.
    """
    mask = mask.to(logp.dtype)
    flag = (experience_flag if experience_flag is not None
            else torch.zeros(logp.shape[0], dtype=torch.bool, device=logp.device)).bool()
    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))

    boosted = flag[:, None] & (advantages > 0)
    clip_high = torch.where(boosted, torch.full_like(ratio, config.clip_high_boosted),
                            torch.full_like(ratio, config.clip_high))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.minimum(torch.maximum(ratio, torch.full_like(ratio, 1 - config.clip_low)),
                                          1 + clip_high)
    pg = torch.maximum(unclipped, clipped)
    # Dual clip: a negative-advantage token with a huge ratio contributes at most c * |A|.
    dual = torch.minimum(pg, -advantages * config.dual_clip_c)
    pg = torch.where(advantages < 0, dual, pg)
    if weights is not None:
        pg = pg * weights
    loss = masked_mean(pg, mask)

    was_clipped = (clipped > unclipped).to(logp.dtype)
    flagged_tokens = mask * flag[:, None].to(mask.dtype)
    plain_tokens = mask * (~flag)[:, None].to(mask.dtype)
    metrics = {
        "pg_loss": float(loss.detach()),
        "ratio_mean": float(masked_mean(ratio.detach(), mask)),
        "clip_frac_flagged": float(masked_mean(was_clipped, flagged_tokens)),
        "clip_frac_unflagged": float(masked_mean(was_clipped, plain_tokens)),
        "dual_clip_frac": float(masked_mean(((advantages < 0) & (unclipped.detach() > dual.detach())).to(logp.dtype),
                                            mask)),
        "boosted_token_frac": float(masked_mean(boosted.to(logp.dtype), mask)),
    }
    if ref_logp is not None and config.kl_coef > 0:
        kl = masked_mean(low_var_kl(logp, ref_logp), mask)
        loss = loss + config.kl_coef * kl
        metrics["kl"] = float(kl.detach())
    if entropy is not None and config.entropy_coef > 0:
        ent = masked_mean(entropy, mask)
        loss = loss - config.entropy_coef * ent
        metrics["entropy"] = float(ent.detach())
    return loss, metrics
