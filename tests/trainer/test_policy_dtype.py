"""A bf16 in-process policy: rollouts from bf16 weights, log-probs near fp32 ones, and never reused as old ones;
`policy.dtype: auto` picks it on CPUs with native bf16."""

from __future__ import annotations

import asyncio

import pytest
import torch

from engine.models import load_model
from tests.helpers import run_env_service
from tests.trainer.test_learning import ENV_YAML
from trainer.config import TrainerConfig
from trainer.local import LocalTrainer
from trainer.policy import InProcessPolicy, Sampling


def _fp32_logprobs(model: torch.nn.Module, prompt: list[int], response: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(response)[:, None])[:, 0]


def test_bf16_policy_generates_near_fp32_logprobs_and_is_not_exact() -> None:
    model, tok = load_model("tiny")
    prompt = tok.encode("go left then right", add_special_tokens=False)
    fp32 = InProcessPolicy(model, tok, max_batch=4)
    bf16 = InProcessPolicy(model, tok, max_batch=4, dtype=torch.bfloat16)
    try:
        assert fp32.exact_logprobs and not bf16.exact_logprobs
        assert next(model.parameters()).dtype == torch.float32  # the training model is untouched
        out = asyncio.run(bf16.generate(prompt, Sampling(max_tokens=16, temperature=1.0, seed=3)))
        reference = _fp32_logprobs(model, prompt, out.token_ids)
        delta = (torch.tensor(out.logprobs) - reference).abs()
        assert out.token_ids and float(delta.mean()) <= 0.05, delta
        exact = asyncio.run(fp32.generate(prompt, Sampling(max_tokens=16, temperature=1.0, seed=3)))
        assert float((torch.tensor(exact.logprobs) - _fp32_logprobs(model, prompt, exact.token_ids)).abs().max()) <= 1e-3
    finally:
        asyncio.run(fp32.aclose())
        asyncio.run(bf16.aclose())


def test_rollout_dtype_auto_is_bf16_only_on_a_cpu_with_native_bf16(monkeypatch) -> None:
    import trainer.local as local

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(local, "native_bf16", lambda: True)
    assert local.rollout_dtype("auto", cpu) == torch.bfloat16
    assert local.rollout_dtype("auto", cuda) is None  # the training dtype
    monkeypatch.setattr(local, "native_bf16", lambda: False)
    assert local.rollout_dtype("auto", cpu) is None
    assert local.rollout_dtype("float32", cpu) == torch.float32
    assert local.rollout_dtype("bfloat16", cpu) == torch.bfloat16


@pytest.fixture(scope="module")
def env_url(tmp_path_factory):
    with run_env_service(ENV_YAML, tmp_path_factory.mktemp("env")) as service:
        yield service.url


@pytest.mark.parametrize(("dtype", "reused"), [("float32", 1.0), ("bfloat16", 0.0)])
def test_rollout_logprobs_are_reused_only_from_an_engine_with_the_training_numerics(env_url, tmp_path, dtype, reused):
    config = TrainerConfig.model_validate({
        "model": "tiny", "seed": 0, "steps": 1, "tasks_per_step": 2, "output_dir": str(tmp_path / "run"),
        "torch_threads": 1, "progress": False, "tensorboard": False, "plot": False,
        "rollout": {"env": "signal", "n": 2, "max_turns": 2, "max_new_tokens": 2, "max_context": 128},
        "policy": {"max_batch": 8, "threads": 1, "dtype": dtype},
        "optim": {"minibatches": 1, "fuse_old_logprobs": False},
        "services": {"env_url": env_url}, "eval": {"before": False, "after": False},
        "ray": {"enabled": False}})
    trainer = LocalTrainer(config)

    async def one_step() -> dict[str, float]:
        await trainer.setup()
        try:
            assert trainer.policy.exact_logprobs is (dtype == "float32")
            return await trainer.train_step()
        finally:
            await trainer.close()

    metrics = asyncio.run(one_step())
    assert metrics["update/samples"] > 0 and metrics["update/reused_old_logprob_frac"] == reused
