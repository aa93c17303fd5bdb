"""LoRA (`trainer.lora`): adapters train, the base stays frozen, and the merged weights serve the same model."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from engine.models import load_model
from tests.helpers import run_env_service
from trainer import lora
from trainer.config import TrainerConfig
from trainer.evaluate import load_checkpoint_model
from trainer.local import LocalTrainer
from trainer.loss import PolicyLossConfig
from trainer.policy import InProcessPolicy, Sampling
from trainer.update import OptimConfig, PolicyUpdater, TrainSample


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_model("tiny")


def trained_adapter(model, tok):
    """A LoRA model after a few real updates (the adapters' B starts at zero, so train it away from 0)."""
    wrapped = lora.wrap(copy.deepcopy(model), lora.LoraSettings(r=4, alpha=8))
    updater = PolicyUpdater(wrapped, OptimConfig(lr=1e-2, epochs=3), PolicyLossConfig(), pad_id=0, total_updates=1)
    prompt = tok.encode("<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    left = tok.encode("left", add_special_tokens=False)
    updater.update([TrainSample(prompt, left, [1] * len(left), [1.0] * len(left))] * 4)
    return wrapped, prompt


def test_only_adapters_train_and_the_merged_weights_compute_the_same_logits(tiny):
    model, tok = tiny
    wrapped, prompt = trained_adapter(model, tok)
    base_names = set(model.state_dict())
    trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    merged = lora.merged_state_dict(wrapped)
    assert set(merged) == base_names
    changed = [n for n in base_names if not torch.equal(merged[n], model.state_dict()[n])]
    assert changed and all(n.endswith(".weight") for n in changed)  # the adapted layers moved
    plain = copy.deepcopy(model)
    plain.load_state_dict(merged)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        assert torch.allclose(plain(ids).logits, wrapped(ids).logits, atol=1e-5)
        assert torch.allclose(lora.merged_copy(wrapped)(ids).logits, wrapped(ids).logits, atol=1e-5)
    assert lora.is_peft(wrapped)  # merging for serving left the trained model wrapped


def test_the_engine_serves_the_merged_adapter(tiny):
    model, tok = tiny
    wrapped, prompt = trained_adapter(model, tok)
    policy = InProcessPolicy(model, tok, max_batch=4, threads=1)

    async def go():
        version = await policy.load_weights(lora.serving_view(wrapped))
        out = await policy.generate(prompt, Sampling(max_tokens=4, temperature=0.0))
        await policy.aclose()
        return version, out

    version, out = asyncio.run(go())
    assert version == 1
    expected = lora.merged_copy(wrapped).generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False)
    assert out.token_ids == expected[0, len(prompt):len(prompt) + len(out.token_ids)].tolist()


ENV_YAML = "env_service:\n  environments:\n    signal: {fallback: first_char}\n"


@pytest.fixture(scope="module")
def env_url(tmp_path_factory):
    with run_env_service(ENV_YAML, tmp_path_factory.mktemp("env")) as service:
        yield service.url


def test_a_lora_run_trains_adapters_and_exports_and_checkpoints_merged_weights(env_url, tmp_path):
    config = TrainerConfig.model_validate({
        "model": "tiny", "seed": 1, "steps": 2, "tasks_per_step": 4, "output_dir": str(tmp_path / "run"),
        "torch_threads": 1, "progress": False, "tensorboard": False, "plot": False,
        "export_dir": str(tmp_path / "export"), "lora": {"r": 4, "alpha": 8},
        "rollout": {"env": "signal", "n": 4, "max_turns": 2, "max_new_tokens": 2, "max_context": 256},
        "optim": {"lr": 0.05, "minibatches": 1}, "services": {"env_url": env_url},
        "eval": {"before": False, "after": False}, "checkpoint": {"every": 2}, "ray": {"enabled": False}})
    trainer = LocalTrainer(config)
    result = asyncio.run(trainer.run())
    assert [h["policy/version"] for h in result["history"]] == [1.0, 2.0]
    assert lora.is_peft(trainer.model)
    exported, _ = load_model(str(tmp_path / "export"))  # a plain HF directory: the adapter is merged
    from_checkpoint, _, step = load_checkpoint_model(str(tmp_path / "run" / "checkpoints"), "tiny")
    base, _ = load_model("tiny")
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        trained = trainer.model(ids).logits
        assert torch.allclose(exported(ids).logits, trained, atol=1e-5)
        assert torch.allclose(from_checkpoint(ids).logits, trained, atol=1e-5)
        assert not torch.allclose(base(ids).logits, trained, atol=1e-4)  # and training moved it
    assert step == 2
