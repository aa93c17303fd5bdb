"""Rollout/update overlap: truncated importance weights (hand-computed), which samples get them, and a
tiny overlapped run over HTTP whose records carry versions at most one behind and whose weights move."""

from __future__ import annotations

import asyncio
import copy
import json
import math
import time

import pytest
import torch

from engine.models import load_model
from tests.helpers import run_env_service
from tests.trainer.test_learning import ENV_YAML  # the cue task: rewards vary within a group from the start
from trainer.config import TrainerConfig
from trainer.local import LocalTrainer
from trainer.loss import PolicyLossConfig, behaviour_weights, policy_loss
from trainer.update import OptimConfig, PolicyUpdater, TrainSample

LOG = math.log


def test_behaviour_weights_are_truncated_ratios_on_the_mask():
    prox = torch.tensor([[LOG(0.5), LOG(0.2), LOG(0.9), LOG(0.3)]])
    behaviour = torch.tensor([[LOG(0.25), LOG(0.4), LOG(0.3), LOG(0.3)]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    # 0.5/0.25 = 2 truncated to the cap 1.5; 0.2/0.4 = 0.5 kept (no floor); mask-0 token: 1; equal: 1.
    weights = behaviour_weights(prox, behaviour, mask, cap=1.5)
    assert torch.allclose(weights, torch.tensor([[1.5, 0.5, 1.0, 1.0]]), atol=1e-6)


def test_weights_scale_each_tokens_clipped_objective():
    config = PolicyLossConfig(clip_low=0.2, clip_high=0.28)
    logp = torch.tensor([[LOG(0.5), LOG(0.5), LOG(0.6)]], requires_grad=True)
    old = torch.tensor([[LOG(0.5), LOG(0.5), LOG(0.4)]])
    adv = torch.tensor([[1.0, -1.0, 1.0]])
    mask = torch.ones(1, 3)
    weights = torch.tensor([[0.5, 2.0, 1.5]])
    # Token terms: -A * ratio, ratio clipped at 1.28 for the third (0.6/0.4 = 1.5 > 1.28 with A > 0):
    # [-1, 1, -1.28] unweighted; weighted [-0.5, 2, -1.92]; token mean (-0.5 + 2 - 1.92) / 3 = -0.14.
    plain, _ = policy_loss(logp, old, adv, mask, None, config)
    weighted, _ = policy_loss(logp, old, adv, mask, None, config, weights=weights)
    assert plain.item() == pytest.approx((-1 + 1 - 1.28) / 3, abs=1e-6)
    assert weighted.item() == pytest.approx(-0.14, abs=1e-6)
    weighted.backward()
    # d/dlogp of -A * w * ratio at ratio 1 is -A * w; the clipped third token gets no gradient.
    assert torch.allclose(logp.grad, torch.tensor([[-0.5 / 3, 2.0 / 3, 0.0]]), atol=1e-6)


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_model("tiny")


def test_only_stale_correctable_samples_are_weighted(tiny):
    model, tok = tiny
    updater = PolicyUpdater(copy.deepcopy(model), OptimConfig(), PolicyLossConfig(importance_cap=1.5), pad_id=0,
                            total_updates=1)
    prompt, response = tok.encode("go left", add_special_tokens=False), tok.encode("north", add_special_tokens=False)
    n = len(response)

    def sample(version: int | None, flagged: bool = False, logprobs: bool = True) -> TrainSample:
        return TrainSample(prompt, response, [1] * n, [1.0] * n, flagged,
                           rollout_logprobs=[0.0] * n if logprobs else None, policy_version=version)

    samples = [sample(3), sample(2), sample(None), sample(2, flagged=True), sample(2, logprobs=False)]
    old = updater.score(updater.model, samples)
    weights = updater._behaviour_weights(samples, old, policy_version=3)
    # On-policy, flagged (context differs) and log-prob-less samples are not corrected.
    assert sorted(weights) == [1, 2]
    # Behaviour log-prob 0 (mu = 1): the weight is pi_prox itself, below 1, never truncated.
    assert torch.allclose(weights[1], old[1].exp(), atol=1e-6)
    metrics = updater.update(samples, policy_version=3)
    assert metrics["update/off_policy_sample_frac"] == pytest.approx(2 / 5)
    assert metrics["update/importance_weight_mean"] == pytest.approx(float(old[1].exp().mean()), rel=1e-5)
    assert metrics["update/importance_truncated_frac"] == 0.0


@pytest.fixture(scope="module")
def env_url(tmp_path_factory):
    with run_env_service(ENV_YAML, tmp_path_factory.mktemp("env")) as service:
        yield service.url


def test_overlapped_run_records_versions_at_most_one_behind_and_trains(env_url, tmp_path):
    steps = 3
    config = TrainerConfig.model_validate({
        "model": "tiny", "seed": 0, "steps": steps, "tasks_per_step": 4, "output_dir": str(tmp_path / "run"),
        "torch_threads": 1, "progress": False, "tensorboard": False, "plot": False, "overlap": True,
        "rollout": {"env": "signal", "n": 4, "max_turns": 2, "max_new_tokens": 1, "max_context": 128},
        "policy": {"max_batch": 32, "threads": 1},
        "optim": {"lr": 5e-3, "minibatches": 2, "micro_batch_size": 16},
        "services": {"env_url": env_url},
        "eval": {"before": False, "after": False, "tasks": 8},
        "ray": {"enabled": False},
    })
    trainer = LocalTrainer(config)

    async def run() -> tuple[list[dict[str, float]], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        await trainer.setup()
        initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        update = trainer.updater.update

        def update_after_a_prefetched_group(*args, **kwargs):
            # Hold the update until the next step's first group is done: its rollouts were then surely
            # generated by the weights this update is replacing (stale by one version when trained on).
            if trainer._prefetch is not None:
                groups, deadline = trainer.group_stats.groups, time.monotonic() + 120
                while trainer.group_stats.groups == groups and time.monotonic() < deadline:
                    time.sleep(0.02)
            return update(*args, **kwargs)

        trainer.updater.update = update_after_a_prefetched_group
        try:
            history = [await trainer.train_step() for _ in range(steps)]
            return history, initial, trainer.model.state_dict()
        finally:
            await trainer.close()

    history, initial, final = asyncio.run(run())
    records = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "index.jsonl").read_text().splitlines()]
    assert len(records) == steps * 4 * 4
    full = [json.loads(line) for shard in sorted((tmp_path / "run" / "rollouts").glob("shard-*.jsonl"))
            for line in shard.read_text().splitlines()]
    assert {r["trajectory_id"] for r in full} == {r["trajectory_id"] for r in records}
    for r in full:
        assert r["trained_version"] == r["step"] - 1  # one weight load per step
        assert r["staleness"] == r["trained_version"] - min(r["policy_versions"])
    stale = [r["staleness"] for r in full]
    assert max(stale) == 1 and min(stale) == 0  # the first step is on-policy; never more than one behind
    assert all(r["staleness"] == 0 for r in full if r["step"] == 1)
    assert [h["rollout/version_lag_max"] for h in history] == [0.0, 1.0, 1.0]
    assert all(h["update/off_policy_sample_frac"] > 0 for h in history[1:])
    assert all(0 < h["update/importance_weight_mean"] <= 2.0 for h in history[1:])
    assert all(h["update/pg_loss"] != 0.0 for h in history)
    assert all(h["update/grad_norm"] > 0 for h in history)
    moved = sum(float((final[k] - initial[k]).abs().sum()) for k in initial)
    assert moved > 0
