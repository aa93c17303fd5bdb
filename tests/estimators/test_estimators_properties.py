"""Property tests of the estimators on random group-structured batches (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from estimators import AdvantageBatch, compute_advantages, estimate

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OUTCOMES = st.sampled_from([0.0, 0.25, 0.5, 1.0]) | st.floats(-5, 5, allow_nan=False)


@st.composite
def batches(draw, min_group: int = 1, max_group: int = 6, zero_steps: bool = True) -> AdvantageBatch:
    """Random groups of trajectories: steps, token layout, masks, labels, anchors, outcomes."""
    group_sizes = draw(st.lists(st.integers(min_group, max_group), min_size=1, max_size=4))
    rows = []
    for g, size in enumerate(group_sizes):
        for _ in range(size):
            k = draw(st.integers(0 if zero_steps else 1, 4))
            ids: list[int] = []
            mask: list[int] = []
            for step in range(k):  # each step: 1-3 policy tokens then 0-2 observation tokens
                n_tokens = draw(st.integers(1, 3))
                ids += [step] * n_tokens
                mask += [draw(st.sampled_from([1, 1, 1, 0])) for _ in range(n_tokens)]
                n_obs = draw(st.integers(0, 2))
                ids += [-1] * n_obs
                mask += [0] * n_obs
            labels = [draw(st.sampled_from([1.0, -1.0])) for _ in range(k)]
            anchors = [draw(st.sampled_from(["s0", "s1", "s2"])) for _ in range(k)]
            rows.append((g, ids, mask, labels, anchors, draw(OUTCOMES)))
    width = max(len(r[1]) for r in rows) + draw(st.integers(0, 2))  # padding
    ids = torch.full((len(rows), width), -1, dtype=torch.long)
    mask = torch.zeros((len(rows), width))
    for i, (_, row_ids, row_mask, *_rest) in enumerate(rows):
        ids[i, : len(row_ids)] = torch.tensor(row_ids, dtype=torch.long)
        mask[i, : len(row_mask)] = torch.tensor(row_mask, dtype=torch.float32)
    return AdvantageBatch(
        response_mask=mask, step_ids=ids, outcome=torch.tensor([r[5] for r in rows], dtype=torch.float32),
        group_index=[r[0] for r in rows], step_labels=[r[3] for r in rows], anchor_keys=[r[4] for r in rows],
    )


ALL_CONFIGS = [
    ("grpo", {"std": "population"}), ("grpo", {"std": "unbiased"}), ("grpo", {"std": "verl"}),
    ("grpo", {"normalize_by_std": False}),
    ("adca_grpo", {"alpha": 0.2}), ("adca_grpo", {"alpha": 0.2, "outcome_placement": "all_steps",
                                                 "length_normalization": True}),
    ("adca_grpo", {"alpha": 0.3, "alpha_schedule": "cosine", "total_steps": 5}),
    ("gigpo", {}), ("gigpo", {"normalize_by_std": True, "std": "population"}), ("gigpo", {"std": "verl"}),
]


@SETTINGS
@given(batch=batches(min_group=2, zero_steps=False), std=st.sampled_from(["population", "unbiased", "verl"]),
       by_std=st.booleans())
def test_grpo_sums_to_zero_within_a_group_with_spread(batch, std, by_std):
    # One value per trajectory: read it from an unmasked copy of the batch.
    batch.response_mask = torch.ones_like(batch.response_mask)
    values = compute_advantages("grpo", batch, {"std": std, "normalize_by_std": by_std})[:, 0].double()
    outcome = batch.outcome.double()
    for rows in batch.groups():
        group = outcome[rows]
        if group.max() != group.min():
            assert abs(float(values[rows].sum())) < 1e-4 * max(1.0, float(values[rows].abs().max()))


@SETTINGS
@given(batch=batches(), scale=st.floats(1e-3, 1e3), step=st.integers(0, 8))
def test_adca_invariant_to_label_magnitude(batch, scale, step):
    config = {"alpha": 0.5, "alpha_schedule": "cosine", "total_steps": 8, "alpha_min": 0.1}
    unit = compute_advantages("adca_grpo", batch, config, training_step=step)
    batch.step_labels = [[v * scale for v in row] for row in batch.step_labels]
    scaled = compute_advantages("adca_grpo", batch, config, training_step=step)
    assert torch.allclose(unit, scaled, atol=1e-5, rtol=1e-5)


@SETTINGS
@given(batch=batches(), which=st.sampled_from(ALL_CONFIGS), step=st.integers(0, 10))
def test_masked_tokens_are_zero_and_nothing_is_nan(batch, which, step):
    name, config = which
    result = estimate(name, batch, config, training_step=step)
    adv = result.advantages
    assert adv.shape == batch.response_mask.shape and adv.dtype == torch.float32
    assert torch.isfinite(adv).all()
    assert (adv[batch.response_mask == 0] == 0).all()
    if name != "grpo":  # step estimators: tokens in no step get 0 as well
        assert (adv[batch.step_ids < 0] == 0).all()


@pytest.mark.parametrize("name,config", ALL_CONFIGS)
@pytest.mark.parametrize("group_size", [1, 2, 3, 7])
def test_no_nan_for_any_group_size_even_with_identical_rows(name, config, group_size):
    # identical outcomes, labels and anchors: zero spread everywhere
    b = group_size
    batch = AdvantageBatch(
        response_mask=torch.ones(b, 4), step_ids=torch.tensor([[0, 0, 1, 1]] * b),
        outcome=torch.full((b,), 0.5), group_index=np.zeros(b, dtype=np.int64),
        step_labels=[[1.0, 1.0]] * b, anchor_keys=[["s0", "s1"]] * b,
    )
    adv = compute_advantages(name, batch, config)
    assert torch.isfinite(adv).all()
    if config.get("std") == "verl" and b == 1:
        # veRL's group-of-one rule (mean 0, std 1) keeps the raw score
        assert torch.allclose(adv, torch.full_like(adv, 0.5 / (1 + 1e-6)))
    else:
        assert adv.abs().max() < 1e-9  # exactly 0 except rounding under veRL's convention


def test_verl_convention_matches_verl_grpo():
    """Our `verl` convention reproduces veRL's own `grpo` estimator (skipped where verl is absent)."""
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    rng = np.random.default_rng(0)
    for trial in range(20):
        b, t = int(rng.integers(1, 12)), int(rng.integers(1, 6))
        uid = np.array([f"u{x}" for x in rng.integers(0, 4, size=b)], dtype=object)
        outcome = torch.tensor(rng.choice([0.0, 0.5, 1.0, 2.0], size=b), dtype=torch.float32)
        mask = torch.tensor(rng.integers(0, 2, size=(b, t)), dtype=torch.float32)
        rewards = torch.zeros(b, t)
        rewards[:, -1] = outcome  # veRL sums the token rewards into the score
        batch = AdvantageBatch.from_token_rewards(rewards, mask, uid)
        for by_std in (True, False):
            want, _ = core_algos.compute_grpo_outcome_advantage(
                token_level_rewards=rewards, response_mask=mask, index=uid, norm_adv_by_std_in_grpo=by_std)
            got = compute_advantages("grpo", batch, {"std": "verl", "normalize_by_std": by_std})
            assert torch.allclose(got, want, atol=1e-6), (trial, by_std)
