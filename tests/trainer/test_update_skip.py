"""An update that cannot change the weights is skipped, and every update frees its gradients."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.models import load_model
from trainer.loss import PolicyLossConfig
from trainer.update import OptimConfig, PolicyUpdater, TrainSample


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_model("tiny")


def samples(tok, advantages: list[float]) -> list[TrainSample]:
    """One row per advantage (its value on every token), each ending in two mask-0 tokens."""
    out = []
    for i, a in enumerate(advantages):
        p = tok.encode(f"<|im_start|>user\nwhich way {i}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
        r = tok.encode(["left", "right then up", "down", "stay"][i % 4] + "<|im_end|>\nok", add_special_tokens=False)
        out.append(TrainSample(p, r, [1] * (len(r) - 2) + [0, 0], [a] * len(r)))
    return out


def weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


def counted(updater: PolicyUpdater) -> list[int]:
    """A list that grows by one at every forward of the updater's model."""
    calls: list[int] = []
    updater.model.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def trained_once(model, tok, **optim) -> PolicyUpdater:
    """An updater that has taken real steps, so AdamW holds momentum a zero-gradient step would still apply."""
    updater = PolicyUpdater(copy.deepcopy(model), OptimConfig(lr=1e-2, weight_decay=0.1, **optim), PolicyLossConfig(),
                            pad_id=0, total_updates=4)
    assert updater.update(samples(tok, [1.0, -1.0, 1.0, -1.0]))["update/optimizer_steps"] == 2.0
    return updater


def test_all_zero_advantages_skip_the_update_and_keep_weights_bit_identical(tiny):
    model, tok = tiny
    updater = trained_once(model, tok)
    before, lr = weights(updater.model), updater.scheduler.get_last_lr()
    optimizer_state = copy.deepcopy(updater.optimizer.state_dict())
    calls = counted(updater)
    zero = samples(tok, [0.0, 0.0, 0.0, 0.0])
    zero[1].advantages[-1] = 5.0  # on a mask-0 token: not trained, so still no gradient
    metrics = updater.update(zero)
    assert calls == []  # no old log-probs, no training forward
    assert torch.equal(weights(updater.model), before)
    assert metrics["update/skipped"] == 1.0 and metrics["update/optimizer_steps"] == 0.0
    assert metrics["update/grad_norm"] == 0.0 and metrics["update/pg_loss"] == 0.0
    assert metrics["update/samples"] == 4.0 and metrics["update/tokens"] == sum(sum(s.loss_mask) for s in zero)
    # Neither AdamW (step count, moments) nor the LR schedule moved.
    state = updater.optimizer.state_dict()["state"]
    assert all(torch.equal(state[k]["step"], v["step"]) and torch.equal(state[k]["exp_avg"], v["exp_avg"])
               for k, v in optimizer_state["state"].items())
    assert updater.scheduler.get_last_lr() == lr and updater.scheduler.last_epoch == 2

    # With the skip off, the same batch runs its forwards, and AdamW's momentum and decay move the weights.
    unskipped = trained_once(model, tok, skip_zero_advantage=False)
    calls = counted(unskipped)
    metrics = unskipped.update(zero)
    assert metrics["update/skipped"] == 0.0 and metrics["update/optimizer_steps"] == 2.0 and len(calls) >= 2
    assert metrics["update/grad_norm"] == 0.0
    assert not torch.equal(weights(unskipped.model), before)


def test_one_nonzero_advantage_still_updates(tiny):
    model, tok = tiny
    updater = PolicyUpdater(copy.deepcopy(model), OptimConfig(lr=1e-3, minibatches=1), PolicyLossConfig(), pad_id=0,
                            total_updates=1)
    before = weights(updater.model)
    calls = counted(updater)
    batch = samples(tok, [0.0, 0.0, 0.0, 0.0])
    batch[2].advantages[0] = 0.5  # one trained token of one row
    metrics = updater.update(batch)
    assert metrics["update/skipped"] == 0.0 and metrics["update/optimizer_steps"] == 1.0
    assert metrics["update/grad_norm"] > 0.0 and len(calls) >= 1
    assert not torch.equal(weights(updater.model), before)


@pytest.mark.parametrize("loss", [PolicyLossConfig(entropy_coef=0.01), PolicyLossConfig(kl_coef=0.1)])
def test_zero_advantages_still_update_when_another_loss_term_has_a_gradient(tiny, loss):
    model, tok = tiny
    policy = copy.deepcopy(model)
    ref = copy.deepcopy(model) if loss.kl_coef else None
    if ref is not None:  # a reference the policy has moved away from: KL has a gradient
        with torch.no_grad():
            next(ref.parameters()).add_(0.01)
    updater = PolicyUpdater(policy, OptimConfig(lr=1e-3, minibatches=1), loss, pad_id=0,
                            total_updates=1, ref_model=ref)
    assert not updater.cannot_move(samples(tok, [0.0, 0.0]))
    assert updater.update(samples(tok, [0.0, 0.0]))["update/skipped"] == 0.0
    # KL to an absent reference is no term: the update is skipped again.
    if loss.kl_coef:
        assert PolicyUpdater(copy.deepcopy(model), OptimConfig(), loss, pad_id=0, total_updates=1).cannot_move(
            samples(tok, [0.0, 0.0]))


def test_zero_advantages_with_kl_skip_only_while_the_policy_is_its_reference(tiny):
    model, tok = tiny
    loss = PolicyLossConfig(kl_coef=0.1)
    updater = PolicyUpdater(copy.deepcopy(model), OptimConfig(lr=1e-3, minibatches=1), loss, pad_id=0,
                            total_updates=3, ref_model=copy.deepcopy(model))
    before = weights(updater.model)
    assert updater.at_reference()
    metrics = updater.update(samples(tok, [0.0, 0.0]))
    assert metrics["update/skipped"] == 1.0 and torch.equal(weights(updater.model), before)
    # Unskipped, the same batch's gradient is rounding: k3's gradient vanishes where logp = ref.
    unskipped = PolicyUpdater(copy.deepcopy(model), OptimConfig(lr=1e-3, minibatches=1, skip_zero_advantage=False),
                              loss, pad_id=0, total_updates=1, ref_model=copy.deepcopy(model))
    assert unskipped.update(samples(tok, [0.0, 0.0]))["update/grad_norm"] < 1e-5
    # One real step moves the policy; from then on KL has a gradient and nothing is skipped.
    assert updater.update(samples(tok, [1.0, -1.0]))["update/skipped"] == 0.0
    assert not updater.at_reference()
    assert updater.update(samples(tok, [0.0, 0.0]))["update/skipped"] == 0.0


def test_the_reference_is_compared_not_assumed(tiny):
    model, tok = tiny
    ref = copy.deepcopy(model)
    with torch.no_grad():
        next(ref.parameters())[0, 0] += 1e-6  # one weight of millions
    updater = PolicyUpdater(copy.deepcopy(model), OptimConfig(), PolicyLossConfig(kl_coef=0.1), pad_id=0,
                            total_updates=1, ref_model=ref)
    assert not updater.at_reference() and not updater.cannot_move(samples(tok, [0.0, 0.0]))


def test_an_update_frees_every_gradient(tiny):
    model, tok = tiny
    updater = PolicyUpdater(copy.deepcopy(model), OptimConfig(lr=1e-3, minibatches=2, micro_batch_size=1),
                            PolicyLossConfig(), pad_id=0, total_updates=1)
    seen: list[int] = []  # parameters holding a gradient at each optimizer step
    updater.optimizer.register_step_pre_hook(
        lambda *_: seen.append(sum(p.grad is not None for p in updater.model.parameters())))
    assert updater.update(samples(tok, [1.0, -1.0, 0.5, -0.5]))["update/optimizer_steps"] == 2.0
    assert len(seen) == 2 and min(seen) > 0  # they existed for the steps
    assert all(p.grad is None for p in updater.model.parameters())


def test_gradient_is_zero_only_without_trained_advantage_and_other_terms():
    from trainer.loss import gradient_is_zero

    adv = torch.tensor([[0.0, 0.0, 2.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])  # the 2.0 sits on an untrained token
    assert gradient_is_zero(adv, mask, kl_coef=0.0, entropy_coef=0.0)
    assert not gradient_is_zero(adv, torch.ones_like(mask), kl_coef=0.0, entropy_coef=0.0)
    assert not gradient_is_zero(adv, mask, kl_coef=0.1, entropy_coef=0.0)
    assert gradient_is_zero(adv, mask, kl_coef=0.1, entropy_coef=0.0, at_reference=True)
    assert not gradient_is_zero(adv, mask, kl_coef=0.1, entropy_coef=0.01, at_reference=True)
    assert not gradient_is_zero(adv, mask, kl_coef=0.0, entropy_coef=-0.01)  # a negative bonus is a term too
