"""The PPO loss against hand-computed values: clip bounds, dual clip, selective boosting, masks."""

import math

import torch

from trainer.loss import PolicyLossConfig, low_var_kl, policy_loss

CFG = PolicyLossConfig()  # clip 0.2 / 0.28, boosted 0.6, dual-clip c = 3


def tokens(*ratios_and_advantages):
    """One sample per (ratio, advantage) pair, one token each."""
    ratios = torch.tensor([[r] for r, _ in ratios_and_advantages], dtype=torch.float64)
    adv = torch.tensor([[a] for _, a in ratios_and_advantages], dtype=torch.float64)
    old = torch.zeros_like(ratios)
    return ratios.log(), old, adv


def test_boosted_bound_only_for_flagged_positive_samples():
    # ratio 1.5, A = +1: plain samples clip at 1.28 -> loss -1.28; flagged at 1.5 (< 1.6) -> -1.5.
    logp, old, adv = tokens((1.5, 1.0), (1.5, 1.0))
    mask = torch.ones_like(adv)
    flag = torch.tensor([False, True])
    loss, m = policy_loss(logp, old, adv, mask, flag, CFG)
    assert math.isclose(float(loss), (-1.28 - 1.5) / 2, rel_tol=1e-9)
    assert m["clip_frac_unflagged"] == 1.0 and m["clip_frac_flagged"] == 0.0

    # A flagged sample with negative advantage keeps the ordinary bounds: ratio 0.5, A = -1
    # -> max(0.5, 0.8) = 0.8 clipped term 0.8 vs unclipped 0.5 -> loss 0.8 for both.
    logp, old, adv = tokens((0.5, -1.0), (0.5, -1.0))
    loss, m = policy_loss(logp, old, adv, torch.ones_like(adv), flag, CFG)
    assert math.isclose(float(loss), 0.8, rel_tol=1e-9)
    assert m["clip_frac_flagged"] == 1.0 and m["clip_frac_unflagged"] == 1.0


def test_dual_clip_caps_negative_advantage_loss():
    # ratio 5, A = -2: unclipped 10, clipped -2 * 1.28 = -2.56 -> max 10, dual cap 3 * 2 = 6.
    logp, old, adv = tokens((5.0, -2.0))
    loss, m = policy_loss(logp, old, adv, torch.ones_like(adv), None, CFG)
    assert math.isclose(float(loss), 6.0, rel_tol=1e-9)
    assert m["dual_clip_frac"] == 1.0


def test_masked_tokens_get_no_gradient_and_empty_mask_is_zero():
    logp = torch.tensor([[0.1, -0.3, 0.2]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 1]])
    loss, _ = policy_loss(logp, old, adv, mask, None, CFG)
    loss.backward()
    assert logp.grad[0, 1] == 0.0 and logp.grad[0, 0] != 0.0
    # token 0: ratio e^0.1 = 1.105 < 1.28 -> -1.105; token 2: ratio e^0.2 = 1.2214, A=-1 -> max(1.2214, 1.2214) = 1.2214
    expected = (-math.exp(0.1) + math.exp(0.2)) / 2
    assert math.isclose(loss.item(), expected, rel_tol=1e-9)
    zero, _ = policy_loss(logp, old, adv, torch.zeros_like(mask), None, CFG)
    assert zero.item() == 0.0


def test_kl_and_entropy_terms():
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    # k3 = exp(ref - logp) - (ref - logp) - 1 = 0.5 - ln(0.5) - 1 = 0.193147...
    assert math.isclose(float(low_var_kl(logp, ref)), 0.5 - math.log(0.5) - 1, rel_tol=1e-9)
    cfg = PolicyLossConfig(kl_coef=0.1, entropy_coef=0.01)
    adv = torch.zeros_like(logp)
    loss, m = policy_loss(logp, logp.clone(), adv, torch.ones_like(adv), None, cfg, ref_logp=ref,
                          entropy=torch.tensor([[2.0]], dtype=torch.float64))
    assert math.isclose(float(loss), 0.1 * (0.5 - math.log(0.5) - 1) - 0.01 * 2.0, rel_tol=1e-9)
    assert "kl" in m and "entropy" in m
