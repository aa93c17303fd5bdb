"""Our loss inside veRL: veRL's `vanilla` numbers when nothing is flagged, boosting only where it should,
and gradients through veRL's own `ppo_loss` on a micro-batch shaped like the actor worker's."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("verl", reason="veRL is installed by the `verl` extra")

from verl.trainer.ppo.core_algos import get_policy_loss_fn  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402

import trainer.verl_plugin  # noqa: E402,F401
from trainer.verl_plugin.loss import EXPERIENCE_FLAG_FIELD, evolver_ppo_loss  # noqa: E402


def actor_config(loss_mode: str = "evolver_boosted", agg: str = "token-mean", **kw) -> ActorConfig:
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2,
                       clip_ratio_high=0.28, loss_agg_mode=agg, policy_loss=PolicyLossConfig(loss_mode=loss_mode),
                       **kw)


@pytest.mark.parametrize("agg", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                                 "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("global_info", [{}, {"dp_size": 2, "batch_num_tokens": 37, "global_batch_size": 9}],
                         ids=["local", "global"])
def test_unflagged_loss_equals_verl_vanilla(agg, global_info):
    gen = torch.Generator().manual_seed(5)
    rows, width = 5, 9
    old = -torch.rand(rows, width, generator=gen) * 2
    logp = (old + torch.randn(rows, width, generator=gen) * 0.5).requires_grad_(True)
    adv = torch.randn(rows, width, generator=gen)
    mask = (torch.rand(rows, width, generator=gen) > 0.3).float()
    mask[3] = 0  # a fully masked row
    is_weights = torch.rand(rows, width, generator=gen) + 0.5
    results = {}
    for mode in ("vanilla", "evolver_boosted"):
        config = actor_config(mode, agg)
        config.global_batch_info.update(global_info)
        loss, _ = get_policy_loss_fn(mode)(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
                                           loss_agg_mode=agg, config=config, rollout_is_weights=is_weights)
        (grad,) = torch.autograd.grad(loss, logp)
        results[mode] = (loss.detach(), grad)
    torch.testing.assert_close(results["evolver_boosted"][0], results["vanilla"][0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(results["evolver_boosted"][1], results["vanilla"][1], rtol=1e-5, atol=1e-8)


# ---------------------------------------------------------------- through veRL's ppo_loss

# Every token has ratio pi/pi_old = 1.4: above clip_high (1.28), below clip_high_boosted (1.6).
RATIO = 1.4
ROWS = [  # (advantage, experience flag, prompt length, response length)
    (+1.0, True, 3, 4),    # boosted: unclipped, gradient flows
    (+1.0, False, 2, 5),   # plain: clipped at 1.28, no gradient
    (-1.0, True, 4, 3),    # negative advantage: the flag changes nothing
    (-1.0, False, 1, 4),
]


def micro_batch(flag_field: str = "tensor"):
    """A micro-batch as the actor worker hands it to its loss: jagged (no-padding) tensors."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 50, (p,), generator=gen) for _, _, p, _ in ROWS]
    responses = [torch.randint(0, 50, (r,), generator=gen) for _, _, _, r in ROWS]
    old = [-torch.rand(r, generator=gen) - 0.1 for _, _, _, r in ROWS]
    # The model's log-probs over prompt + response, shifted by one as veRL's engines return them:
    # entry [offset + p - 1 + t] is the log-prob of response token t.
    full = []
    for (_, _, p, r), o in zip(ROWS, old, strict=True):
        seq = torch.zeros(p + r)
        seq[p - 1: p - 1 + r] = o + math.log(RATIO)
        full.append(seq)
    log_probs = torch.cat(full).requires_grad_(True)
    offsets = torch.tensor([0] + [p + r for _, _, p, r in ROWS]).cumsum(0)
    nested_logp = torch.nested.nested_tensor_from_jagged(log_probs, offsets=offsets)

    def jagged(items):
        return torch.nested.as_nested_tensor(items, layout=torch.jagged)

    tensors = {
        "prompts": jagged(prompts), "responses": jagged(responses),
        "response_mask": jagged([torch.ones(r, dtype=torch.int64) for _, _, _, r in ROWS]),
        "old_log_probs": jagged(old),
        "advantages": jagged([torch.full((r,), a) for a, _, _, r in ROWS]),
    }
    flags = [f for _, f, _, _ in ROWS]
    if flag_field == "tensor":
        tensors[EXPERIENCE_FLAG_FIELD] = torch.tensor([float(f) for f in flags])
    elif flag_field == "extra_fields":
        tensors["extra_fields"] = [{"experience_flag": f, "task_id": "t"} for f in flags]
    data = tu.get_tensordict(tensor_dict=tensors,
                             non_tensor_dict={"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None})
    return data, log_probs, nested_logp


def response_grads(log_probs: torch.Tensor) -> list[torch.Tensor]:
    grads, offset = [], 0
    for _, _, p, r in ROWS:
        grads.append(log_probs.grad[offset + p - 1: offset + p - 1 + r])
        offset += p + r
    return grads


def run_loss(flag_field: str, clip_high_boosted: float = 0.6):
    data, log_probs, nested = micro_batch(flag_field)
    config = actor_config()
    loss, metrics = evolver_ppo_loss(config, {"log_probs": nested}, data, clip_high_boosted=clip_high_boosted)
    loss.backward()
    return loss, metrics, response_grads(log_probs)


@pytest.mark.parametrize("flag_field", ["tensor", "extra_fields"])
def test_boost_applies_only_to_flagged_rows_with_positive_advantage(flag_field):
    loss, metrics, grads = run_loss(flag_field)
    assert torch.isfinite(loss)
    boosted, plain_pos, flagged_neg, plain_neg = grads
    assert torch.all(boosted != 0)          # ratio 1.4 < 1 + 0.6: still learning
    assert torch.all(plain_pos == 0)        # ratio 1.4 > 1 + 0.28: clipped
    assert torch.all(flagged_neg != 0) and torch.all(plain_neg != 0)
    # Token-mean over 16 tokens: d/dlogp (-A * ratio) / N = -A * ratio / N on every unclipped token.
    n = sum(r for *_, r in ROWS)
    torch.testing.assert_close(boosted, torch.full_like(boosted, -RATIO / n))
    torch.testing.assert_close(flagged_neg, torch.full_like(flagged_neg, RATIO / n))
    assert "actor/pg_loss" in metrics and metrics["actor/boosted_token_frac"].values == [pytest.approx(4 / n)]


def test_without_boost_headroom_the_flag_changes_nothing_for_negative_rows_and_clips_positive_ones():
    # clip_high_boosted below the ratio: the flagged positive row is clipped too.
    _, _, grads = run_loss("tensor", clip_high_boosted=0.3)
    assert torch.all(grads[0] == 0) and torch.all(grads[1] == 0)
    _, _, boosted_grads = run_loss("tensor")
    torch.testing.assert_close(grads[2], boosted_grads[2])
    torch.testing.assert_close(grads[3], boosted_grads[3])


def test_missing_flag_and_wrong_loss_mode_fail_clearly():
    data, _, nested = micro_batch(flag_field="none")
    with pytest.raises(KeyError, match="evolver_sync"):
        evolver_ppo_loss(actor_config(), {"log_probs": nested}, data)
    data, _, nested = micro_batch()
    with pytest.raises(ValueError, match="loss_mode=evolver_boosted"):
        evolver_ppo_loss(actor_config("vanilla"), {"log_probs": nested}, data)
