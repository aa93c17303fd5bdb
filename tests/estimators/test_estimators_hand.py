"""Estimators against values computed by hand from the formulas (to 1e-6).

The example: two task groups of three trajectories with 3, 2, 1 steps (group a) and 2, 3, 1 steps
(group b). Expected values are written as the arithmetic of the formulas, not computed by the code
under test.
"""

from __future__ import annotations

import math

import pytest
import torch

from estimators import (
    AdcaGrpoConfig,
    AdvantageBatch,
    BatchError,
    GigpoConfig,
    GrpoConfig,
    compute_advantages,
    estimate,
)

#             step ids per token (-1: no step)   loss mask
LAYOUT = [
    ([0, 0, 0, 1, 1, -1, 2, 2], [1, 1, 0, 1, 1, 0, 1, 1]),  # a0: 3 steps; token 2 is in step 0 but masked
    ([0, 0, 0, -1, 1, -1, -1, -1], [1, 1, 1, 1, 1, 0, 0, 0]),  # a1: 2 steps; token 3 is policy but in no step
    ([0, 0, -1, -1, -1, -1, -1, -1], [1, 1, 0, 0, 0, 0, 0, 0]),  # a2: 1 step
    ([0, -1, 1, 1, -1, -1, -1, -1], [1, 0, 1, 1, 0, 0, 0, 0]),  # b0: 2 steps
    ([0, -1, 1, -1, 2, 2, 2, -1], [1, 0, 1, 0, 1, 1, 1, 0]),  # b1: 3 steps
    ([0, 0, 0, 0, -1, -1, -1, -1], [1, 1, 1, 1, 0, 0, 0, 0]),  # b2: 1 step
]
OUTCOME = [1.0, 0.0, 1.0, 0.5, 0.0, 0.0]
GROUPS = ["a", "a", "a", "b", "b", "b"]
LABELS = [[1, -1, 1], [-1, -1], [1], [1, -1], [-1, 1, -1], [-1]]
ANCHORS = [["s0", "s1", "s2"], ["s0", "s1"], ["s0"], ["s0", "x"], ["s0", "x", "x"], ["s0"]]


def make_batch(labels=LABELS, anchors=ANCHORS, step_rewards=None) -> AdvantageBatch:
    return AdvantageBatch(
        response_mask=torch.tensor([m for _, m in LAYOUT], dtype=torch.float32),
        step_ids=torch.tensor([s for s, _ in LAYOUT], dtype=torch.long),
        outcome=torch.tensor(OUTCOME),
        group_index=GROUPS,
        step_labels=labels,
        anchor_keys=anchors,
        step_rewards=step_rewards,
    )


def per_row(values: list[float]) -> torch.Tensor:
    """A trajectory-level value on every policy token of its row."""
    return torch.tensor([[v * m for m in mask] for v, (_, mask) in zip(values, LAYOUT, strict=True)], dtype=torch.float32)


def per_step(values: list[list[float]]) -> torch.Tensor:
    """Step t's value on the policy tokens whose step id is t; everything else 0."""
    rows = []
    for steps, (ids, mask) in zip(values, LAYOUT, strict=True):
        rows.append([steps[s] if (s >= 0 and m) else 0.0 for s, m in zip(ids, mask, strict=True)])
    return torch.tensor(rows, dtype=torch.float32)


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-6, rtol=0), f"\n{got}\n!=\n{want}"


# ---------------------------------------------------------------- grpo
# group a: outcomes 1, 0, 1 -> mean 2/3, deviations 1/3, -2/3, 1/3, sum of squares 6/9
#   population std sqrt(6/9 / 3) = sqrt(2)/3; unbiased std sqrt(6/9 / 2) = sqrt(1/3)
# group b: outcomes .5, 0, 0 -> mean 1/6, deviations 1/3, -1/6, -1/6, sum of squares 1/6
#   population std sqrt(1/18); unbiased std sqrt(1/12)
DEV = [1 / 3, -2 / 3, 1 / 3, 1 / 3, -1 / 6, -1 / 6]


def test_grpo_population():
    a, b = math.sqrt(2) / 3, math.sqrt(1 / 18)
    want = [DEV[0] / a, DEV[1] / a, DEV[2] / a, DEV[3] / b, DEV[4] / b, DEV[5] / b]
    assert want[0] == pytest.approx(1 / math.sqrt(2)) and want[3] == pytest.approx(math.sqrt(2))
    close(compute_advantages("grpo", make_batch(), GrpoConfig(std="population")), per_row(want))


def test_grpo_unbiased_is_default():
    a, b = math.sqrt(1 / 3), math.sqrt(1 / 12)
    want = [DEV[0] / a, DEV[1] / a, DEV[2] / a, DEV[3] / b, DEV[4] / b, DEV[5] / b]
    close(compute_advantages("grpo", make_batch()), per_row(want))


def test_grpo_verl_convention_adds_epsilon():
    a, b = math.sqrt(1 / 3) + 1e-6, math.sqrt(1 / 12) + 1e-6
    want = [DEV[0] / a, DEV[1] / a, DEV[2] / a, DEV[3] / b, DEV[4] / b, DEV[5] / b]
    close(compute_advantages("grpo", make_batch(), GrpoConfig(std="verl")), per_row(want))


def test_dr_grpo_subtracts_the_mean_only():
    close(compute_advantages("grpo", make_batch(), {"normalize_by_std": False}), per_row(DEV))


def test_grpo_group_of_one_and_zero_spread():
    # rows: group x alone (outcome .7), group y with two equal outcomes (.3, .3)
    batch = AdvantageBatch(response_mask=torch.ones(3, 2), step_ids=torch.zeros(3, 2, dtype=torch.long),
                           outcome=torch.tensor([0.7, 0.3, 0.3]), group_index=[1, 2, 2])
    for std in ("population", "unbiased"):
        assert compute_advantages("grpo", batch, {"std": std}).abs().max() == 0
    # veRL: a group of one has mean 0 and std 1, so it keeps its score (.7 / (1 + 1e-6)); the
    # zero-spread group gets 0 / (0 + 1e-6) = 0.
    got = compute_advantages("grpo", batch, {"std": "verl"})
    close(got, torch.tensor([[0.7 / (1 + 1e-6)] * 2, [0.0] * 2, [0.0] * 2]))
    close(compute_advantages("grpo", batch, {"std": "verl", "normalize_by_std": False}),
          torch.tensor([[0.7] * 2, [0.0] * 2, [0.0] * 2]))


# ---------------------------------------------------------------- adca_grpo
# Labels, group a: a0 [+1,-1,+1] (mean 1/3), a1 [-1,-1] (mean -1), a2 [+1] (mean 1)
#   mu = (1/3 - 1 + 1)/3 = 1/9; deviations: GOOD 8/9, BAD -10/9
#   var = mean(a0: (64+100+64)/81/3 = 76/81, a1: 100/81, a2: 64/81) = 80/81 -> sd = sqrt(80)/9
#   z(GOOD) = 8/sqrt(80), z(BAD) = -10/sqrt(80)
# group b: b0 [+1,-1] (mean 0), b1 [-1,+1,-1] (mean -1/3), b2 [-1] (mean -1)
#   mu = -4/9; deviations: GOOD 13/9, BAD -5/9
#   var = mean(b0: (169+25)/81/2 = 97/81, b1: (25+169+25)/81/3 = 73/81, b2: 25/81) = 65/81
#   z(GOOD) = 13/sqrt(65), z(BAD) = -5/sqrt(65)
# Outcome z (population std): a: 1/sqrt2, -sqrt2, 1/sqrt2; b: sqrt2, -1/sqrt2, -1/sqrt2
AG, AB = 8 / math.sqrt(80), -10 / math.sqrt(80)
BG, BB = 13 / math.sqrt(65), -5 / math.sqrt(65)
ATTR = [[AG, AB, AG], [AB, AB], [AG], [BG, BB], [BB, BG, BB], [BB]]
OUT = [1 / math.sqrt(2), -math.sqrt(2), 1 / math.sqrt(2), math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2)]


def suffix(rewards: list[float]) -> list[float]:
    return [sum(rewards[t:]) for t in range(len(rewards))]


def test_adca_last_step_constant_alpha():
    alpha = 0.1
    # r_t = alpha * z_t, plus the outcome z on the last step; A_t = sum of r_j for j >= t
    want = [suffix([alpha * z for z in attr[:-1]] + [alpha * attr[-1] + o]) for attr, o in zip(ATTR, OUT, strict=True)]
    assert want[0] == pytest.approx([0.1 * AG + 0.1 * AB + 0.1 * AG + OUT[0], 0.1 * AB + 0.1 * AG + OUT[0],
                                     0.1 * AG + OUT[0]])
    result = estimate("adca_grpo", make_batch(), AdcaGrpoConfig(alpha=alpha))
    close(result.advantages, per_step(want))
    assert result.metrics["adv/alpha"] == pytest.approx(alpha)


def test_adca_all_steps_constant_alpha():
    alpha = 0.1
    want = [suffix([alpha * z + o for z in attr]) for attr, o in zip(ATTR, OUT, strict=True)]
    got = compute_advantages("adca_grpo", make_batch(), AdcaGrpoConfig(alpha=alpha, outcome_placement="all_steps"))
    close(got, per_step(want))


@pytest.mark.parametrize("placement", ["last_step", "all_steps"])
def test_adca_cosine_decay(placement):
    # alpha 0.2 -> 0.05 over 10 steps, at step 4: 0.05 + 0.5 * 0.15 * (1 + cos(0.4 pi))
    alpha = 0.05 + 0.5 * 0.15 * (1 + math.cos(0.4 * math.pi))
    assert alpha == pytest.approx(0.1481763, abs=1e-7)
    config = AdcaGrpoConfig(alpha=0.2, alpha_min=0.05, alpha_schedule="cosine", total_steps=10,
                            outcome_placement=placement)
    if placement == "last_step":
        want = [suffix([alpha * z for z in attr[:-1]] + [alpha * attr[-1] + o]) for attr, o in zip(ATTR, OUT, strict=True)]
    else:
        want = [suffix([alpha * z + o for z in attr]) for attr, o in zip(ATTR, OUT, strict=True)]
    close(compute_advantages("adca_grpo", make_batch(), config, training_step=4), per_step(want))
    # past total_steps the decay stays at alpha_min
    late = estimate("adca_grpo", make_batch(), config, training_step=25)
    assert late.metrics["adv/alpha"] == pytest.approx(0.05)


def test_adca_length_normalization():
    alpha = 0.1
    want = [suffix([(alpha * z) / math.sqrt(len(attr)) for z in attr[:-1]]
                   + [(alpha * attr[-1] + o) / math.sqrt(len(attr))]) for attr, o in zip(ATTR, OUT, strict=True)]
    got = compute_advantages("adca_grpo", make_batch(), AdcaGrpoConfig(alpha=alpha, length_normalization=True))
    close(got, per_step(want))


def test_adca_after_prm_steps_is_grpo():
    config = AdcaGrpoConfig(alpha=0.1, prm_steps=3, after_prm=GrpoConfig(std="population"))
    inside = estimate("adca_grpo", make_batch(), config, training_step=2)
    assert inside.metrics["adv/attribution_active"] == 1.0
    after = estimate("adca_grpo", make_batch(labels=None), config, training_step=3)
    assert after.metrics["adv/attribution_active"] == 0.0
    # population GRPO of the outcome on every policy token (see test_grpo_population)
    close(after.advantages, per_row(OUT))


# Outcomes equal within group b (0, 0, 0): its outcome z is 0, so keep leaves b on its labels alone (the
# same z as above: the labels did not change) and skip zeroes it. Group a's outcomes are unchanged.
EQUAL_B = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
# Policy tokens of each step in LAYOUT (tokens in no step get 0 whatever the step values).
TOKENS_PER_STEP = [[2, 2, 2], [3, 1], [2], [1, 2], [1, 1, 3], [4]]


def equal_b_batch() -> AdvantageBatch:
    batch = make_batch()
    batch.outcome = torch.tensor(EQUAL_B)
    return batch


def token_mass(rows: list[list[float]], tokens: list[list[int]]) -> float:
    """sum over steps of |A_t| times the step's policy tokens."""
    return sum(abs(v) * n for row, counts in zip(rows, tokens, strict=True) for v, n in zip(row, counts, strict=True))


@pytest.mark.parametrize("policy", ["keep", "skip"])
def test_adca_when_outcomes_equal(policy):
    alpha = 0.1
    group_a = [suffix([alpha * z for z in attr[:-1]] + [alpha * attr[-1] + o]) for attr, o in zip(ATTR[:3], OUT[:3], strict=True)]
    group_b = [suffix([alpha * z for z in attr]) for attr in ATTR[3:]] if policy == "keep" else [[0.0] * len(a) for a in ATTR[3:]]
    result = estimate("adca_grpo", equal_b_batch(), AdcaGrpoConfig(alpha=alpha, when_outcomes_equal=policy))
    close(result.advantages, per_step(group_a + group_b))
    assert result.metrics["adv/equal_outcome_groups"] == 1.0
    # keep: b0 = [0.1 (BG + BB), 0.1 BB], b1 = [0.1 (2 BB + BG), 0.1 (BG + BB), 0.1 BB], b2 = [0.1 BB]
    if policy == "keep":
        assert group_b[0] == pytest.approx([0.1 * (BG + BB), 0.1 * BB])
        b_mass = token_mass(group_b, TOKENS_PER_STEP[3:])
        share = b_mass / (token_mass(group_a, TOKENS_PER_STEP[:3]) + b_mass)
        assert share == pytest.approx(result.metrics["adv/equal_outcome_mass_share"], abs=1e-6)
        assert 0.0 < share < 1.0
    else:
        assert result.metrics["adv/equal_outcome_mass_share"] == 0.0


def test_adca_skip_changes_nothing_when_outcomes_differ():
    keep = estimate("adca_grpo", make_batch(), AdcaGrpoConfig(alpha=0.1))
    skip = estimate("adca_grpo", make_batch(), AdcaGrpoConfig(alpha=0.1, when_outcomes_equal="skip"))
    close(skip.advantages, keep.advantages)
    assert skip.metrics["adv/equal_outcome_groups"] == 0.0 == skip.metrics["adv/equal_outcome_mass_share"]


def test_adca_needs_labels_for_every_row():
    labels = [*LABELS[:5], None]
    with pytest.raises(BatchError, match=r"rows \[5\]"):
        compute_advantages("adca_grpo", make_batch(labels=labels))


# ---------------------------------------------------------------- gigpo
# gamma 0.9, step weight 0.5, mean_norm (subtract means). Returns R_{i,t} = 0.9^(K-1-t) * outcome:
#   a0 [.81, .9, 1], a1 [0, 0], a2 [1]; b0 [.45, .5], b1 [0, 0, 0], b2 [0]
# Anchor groups (within a task group): a/s0 {.81, 0, 1} mean 1.81/3; a/s1 {.9, 0} mean .45; a/s2 {1}
#   singleton -> 0; b/s0 {.45, 0, 0} mean .15; b/x {.5 (b0), 0, 0 (b1 twice)} mean 1/6
# Episode advantage (mean_norm): outcome minus group mean = DEV.
def test_gigpo_mean_norm_with_repeated_anchor():
    w, sa0, sb0 = 0.5, 1.81 / 3, 0.15
    want = [
        [DEV[0] + w * (0.81 - sa0), DEV[0] + w * (0.9 - 0.45), DEV[0] + w * 0.0],
        [DEV[1] + w * (0 - sa0), DEV[1] + w * (0 - 0.45)],
        [DEV[2] + w * (1 - sa0)],
        [DEV[3] + w * (0.45 - sb0), DEV[3] + w * (0.5 - 1 / 6)],
        [DEV[4] + w * (0 - sb0), DEV[4] + w * (0 - 1 / 6), DEV[4] + w * (0 - 1 / 6)],
        [DEV[5] + w * (0 - sb0)],
    ]
    result = estimate("gigpo", make_batch(labels=None), GigpoConfig(gamma=0.9, step_weight=w))
    close(result.advantages, per_step(want))
    assert result.metrics["adv/anchor_groups"] == 5


def test_gigpo_std_norm_with_step_rewards():
    # Population std at both levels; env step rewards: b1 earns 0.2 at its step 1.
    # b1 returns: step 2: 0; step 1: 0.2 + 0.9*0 = 0.2; step 0: 0 + 0.9*0.2 = 0.18
    # Episode: outcome population z = OUT.
    def z(values: list[float], x: float) -> float:
        mean = sum(values) / len(values)
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        return (x - mean) / sd

    a_s0, a_s1 = [0.81, 0.0, 1.0], [0.9, 0.0]
    b_s0, b_x = [0.45, 0.18, 0.0], [0.5, 0.2, 0.0]
    want = [
        [OUT[0] + z(a_s0, 0.81), OUT[0] + z(a_s1, 0.9), OUT[0]],
        [OUT[1] + z(a_s0, 0.0), OUT[1] + z(a_s1, 0.0)],
        [OUT[2] + z(a_s0, 1.0)],
        [OUT[3] + z(b_s0, 0.45), OUT[3] + z(b_x, 0.5)],
        [OUT[4] + z(b_s0, 0.18), OUT[4] + z(b_x, 0.2), OUT[4] + z(b_x, 0.0)],
        [OUT[5] + z(b_s0, 0.0)],
    ]
    # As the environments give them: the final score is the last step's reward (OUTCOME), not added again.
    rewards = [[0, 0, 1.0], [0, 0], [1.0], [0, 0.5], [0, 0.2, 0], [0]]
    config = GigpoConfig(gamma=0.9, step_weight=1.0, std="population", normalize_by_std=True)
    close(compute_advantages("gigpo", make_batch(labels=None, step_rewards=rewards), config), per_step(want))


# ---------------------------------------------------------------- registry and validation
def test_unknown_estimator_and_wrong_config_type():
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        compute_advantages("ppo", make_batch())
    with pytest.raises(TypeError, match="GrpoConfig"):
        compute_advantages("grpo", make_batch(), AdcaGrpoConfig())
    with pytest.raises(ValueError, match="alpha_schedule=cosine needs total_steps"):
        AdcaGrpoConfig(alpha_schedule="cosine")


def test_bad_batches_name_the_problem():
    batch = make_batch()
    batch.outcome = torch.tensor([1.0, float("nan"), 1, 0, 0, 0])
    with pytest.raises(BatchError, match=r"outcome is not finite in rows \[1\]"):
        compute_advantages("grpo", batch)
    short = [*LABELS[:5], [1, 1]]  # b2 has one step
    with pytest.raises(BatchError, match="row 4: a token has step id 2 but the row has 2 steps"):
        compute_advantages("adca_grpo", make_batch(labels=[[1, -1, 1], [-1, -1], [1], [1, -1], [-1, 1], [-1]]))
    with pytest.raises(BatchError, match="row 5: anchor_keys has 1 entries but the row has 2 steps"):
        compute_advantages("adca_grpo", make_batch(labels=short))


# ---------------------------------------------------------------- paired-branch ask credits
# A 2-rollout group. Row 0 asked at step 1 (its answer's tokens are mask 0) and succeeded; its branch without the
# answer failed, so c_{0,1} = 1 - 0 = 1. Row 1 did not ask (no credits) and failed.
ASK_LAYOUT = [([0, 0, 1, 1, 1, 2, 2], [1, 1, 1, 0, 0, 1, 1]),  # step 0, the ask (1: 1 policy + 2 answer tokens), 2
              ([0, 0, 1, 1, -1, -1, -1], [1, 1, 1, 1, 0, 0, 0])]


def ask_batch(credits, outcome=(1.0, 0.0), **fields) -> AdvantageBatch:
    return AdvantageBatch(response_mask=torch.tensor([m for _, m in ASK_LAYOUT], dtype=torch.float32),
                          step_ids=torch.tensor([s for s, _ in ASK_LAYOUT], dtype=torch.long),
                          outcome=torch.tensor(outcome), group_index=["g", "g"], step_credits=credits, **fields)


def on_ask_layout(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor([[steps[s] if (s >= 0 and m) else 0.0 for s, m in zip(ids, mask, strict=True)]
                         for steps, (ids, mask) in zip(values, ASK_LAYOUT, strict=True)], dtype=torch.float32)


def test_adca_adds_the_ask_credit_to_the_asking_steps_reward():
    # labels [1, 1, 1] and [-1, 1]: mu = (1 + 0) / 2 = 0.5; var = (0.25 + (2.25 + 0.25) / 2) / 2 = 0.75
    z = 1 / math.sqrt(0.75)
    a0, a1 = [0.5 * z] * 3, [-1.5 * z, 0.5 * z]
    # outcomes 1, 0 -> o = +1, -1 (population); r_{i,t} = 0.1 a_{i,t} + [t = K_i - 1] o_i + c_{i,t}
    r0 = [0.1 * a0[0], 0.1 * a0[1] + 1.0, 0.1 * a0[2] + 1.0]
    r1 = [0.1 * a1[0], 0.1 * a1[1] - 1.0]
    want = [[r0[0] + r0[1] + r0[2], r0[1] + r0[2], r0[2]], [r1[0] + r1[1], r1[1]]]
    batch = ask_batch([[0.0, 1.0, 0.0], None], step_labels=[[1, 1, 1], [-1, 1]])
    result = estimate("adca_grpo", batch, AdcaGrpoConfig(alpha=0.1, outcome_std="population"))
    close(result.advantages, on_ask_layout(want))
    assert result.metrics["adv/credited_steps"] == 1.0
    # The credit moves the asking step and the steps before it by exactly c, the steps after it not at all.
    plain = estimate("adca_grpo", ask_batch(None, step_labels=[[1, 1, 1], [-1, 1]]),
                     AdcaGrpoConfig(alpha=0.1, outcome_std="population"))
    assert "adv/credited_steps" not in plain.metrics
    close(result.advantages - plain.advantages, on_ask_layout([[1.0, 1.0, 0.0], [0.0, 0.0]]))
    # Equal outcomes under `skip`: the labels' part is dropped, the credit (a paired comparison) stays.
    skipped = estimate("adca_grpo", ask_batch([[0.0, 1.0, 0.0], None], outcome=(1.0, 1.0),
                                              step_labels=[[1, 1, 1], [-1, 1]]),
                       AdcaGrpoConfig(alpha=0.1, when_outcomes_equal="skip"))
    close(skipped.advantages, on_ask_layout([[1.0, 1.0, 0.0], [0.0, 0.0]]))


def test_gigpo_adds_the_ask_credit_to_the_asking_steps_return():
    # step rewards [0, 0, 1] (the env's final score) and [0, 0]; credit c_{0,1} = 1; gamma 0.5
    # returns row 0: R2 = 1, R1 = 1 + 0.5 * 1 = 1.5, R0 = 0 + 0.5 * 1.5 = 0.75; row 1: 0, 0
    # anchors s0 {0.75, 0} -> +-0.375, s1 {1.5, 0} -> +-0.75, s2 alone -> 0; episode (mean norm) +-0.5
    want = [[0.5 + 0.375, 0.5 + 0.75, 0.5], [-0.5 - 0.375, -0.5 - 0.75]]
    fields = dict(step_rewards=[[0.0, 0.0, 1.0], [0.0, 0.0]], anchor_keys=[["s0", "s1", "s2"], ["s0", "s1"]])
    config = GigpoConfig(gamma=0.5, std="population")
    result = estimate("gigpo", ask_batch([[0.0, 1.0, 0.0], None], **fields), config)
    close(result.advantages, on_ask_layout(want))
    assert result.metrics["adv/credited_steps"] == 1.0
    # Without the credit: R = 0.25, 0.5, 1 -> s0 +-0.125, s1 +-0.25
    plain = estimate("gigpo", ask_batch(None, **fields), config)
    close(plain.advantages, on_ask_layout([[0.625, 0.75, 0.5], [-0.625, -0.75]]))


def test_a_credit_row_of_the_wrong_length_is_refused():
    with pytest.raises(BatchError, match="step_credits has 2 entries but the row has 3 steps"):
        estimate("gigpo", ask_batch([[0.0, 1.0], None], anchor_keys=[["s0", "s1", "s2"], ["s0", "s1"]]))
