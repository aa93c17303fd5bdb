"""Golden run: the tiny model trains 3 steps at a fixed seed and gives the same numbers as always.

A refactor that keeps behaviour keeps these: each step's gradient norm and every rollout's advantages
(per turn: GiGPO gives each step of a trajectory its own value) are pinned at a relative 1e-5. Real parts
throughout: the env service over HTTP (in-process server), the in-process engine's rollouts, GiGPO on
the anchor states, the PPO update. When a change is *meant* to move training (a new default, a fix in
the estimator or the loss), print the new values with `GOLDEN_PRINT=1` and replace the tables below,
saying why in the commit.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from env_service.app import build_app
from env_service.settings import EnvServiceSettings
from tests.helpers import InProcessServer
from trainer.config import TrainerConfig
from trainer.local import LocalTrainer

STEPS = 3
REL = 1e-5

# update/grad_norm per step (the mean over the step's two minibatches). Repeated runs differ by ~2e-7 relative
# (the order of float sums in threaded kernels), well inside REL.
GRAD_NORMS: list[float] = [2.351753056049347, 1.702793538570404, 2.5786314010620117]

# Per (step, task): its rollouts (sorted by response tokens) as (outcome, per-turn advantages).
ADVANTAGES: dict[tuple[int, str], list[tuple[float, list[float]]]] = {
    (1, "signal-train-0001"): [(1.0, [0.9750000238418579, 1.0]), (1.0, [0.9750000238418579, 1.0]), (0.0, [-0.9750000238418579, -1.0]), (0.0, [-0.9750000238418579, -1.0])],
    (1, "signal-train-0004"): [(0.0, [0.0, 0.0]), (0.0, [0.0, 0.0]), (0.0, [0.0, 0.0]), (0.0, [0.0, 0.0])],
    (2, "signal-train-0002"): [(0.0, [-0.48750001192092896, -0.5]), (1.0, [1.462499976158142, 1.5]), (0.0, [-0.48750001192092896, -0.5]), (0.0, [-0.48750001192092896, -0.5])],
    (2, "signal-train-0005"): [(0.0, [0.0, 0.0]), (0.0, [0.0, 0.0]), (0.0, [0.0, 0.0]), (0.0, [0.0, 0.0])],
    (3, "signal-train-0000"): [(0.0, [-0.9750000238418579, -1.0]), (1.0, [0.9750000238418579, 1.0]), (0.0, [-0.9750000238418579, -1.0]), (1.0, [0.9750000238418579, 1.0])],
    (3, "signal-train-0003"): [(1.0, [0.48750001192092896, 0.5]), (1.0, [0.48750001192092896, 0.5]), (0.0, [-1.462499976158142, -1.5]), (1.0, [0.48750001192092896, 0.5])],
}


@pytest.fixture(scope="module")
def env_url():
    settings = EnvServiceSettings(environments={"signal": {
        "options": ["north", "south"], "fallback": "first_char", "cue": "{signal}", "cue_repeat": 4,
        "tasks_per_split": {"train": 8, "validation": 2, "test": 2}}})
    with InProcessServer(build_app(settings)) as server:
        yield server.url


def golden_config(env_url: str, out) -> TrainerConfig:
    return TrainerConfig.model_validate({
        "model": "tiny", "seed": 0, "steps": STEPS, "tasks_per_step": 2, "output_dir": str(out),
        "torch_threads": 1, "progress": False, "tensorboard": False, "plot": False,
        "rollout": {"env": "signal", "n": 4, "max_turns": 2, "max_new_tokens": 2, "max_context": 256,
                    "temperature": 1.0},
        "policy": {"threads": 1},
        "advantage": {"estimator": "gigpo"},
        "optim": {"lr": 1e-3, "epochs": 1, "minibatches": 2, "micro_batch_size": 8},
        "services": {"env_url": env_url},
        "eval": {"before": False, "after": False, "tasks": 1},
        "ray": {"enabled": False},
    })


def per_turn_advantages(record: dict) -> list[float]:
    """The advantage of each turn: that of the turn's first trained token."""
    seen: dict[int, float] = {}
    for advantage, trained, turn in zip(record["advantages"], record["loss_mask"], record["step_ids"], strict=True):
        if trained and turn not in seen:
            seen[turn] = advantage
    return [seen[turn] for turn in sorted(seen)]


def run_golden(env_url: str, out) -> tuple[list[float], dict[tuple[int, str], list[tuple[float, list[float]]]]]:
    async def train() -> list[dict[str, float]]:
        trainer = LocalTrainer(golden_config(env_url, out))
        await trainer.setup()
        try:
            return [await trainer.train_step() for _ in range(STEPS)]
        finally:
            await trainer.close()

    metrics = asyncio.run(train())
    records = [json.loads(line) for shard in sorted((out / "rollouts").glob("shard-*.jsonl"))
               for line in shard.read_text().splitlines()]
    advantages: dict[tuple[int, str], list[tuple[float, list[float]]]] = {}
    for record in sorted(records, key=lambda r: (r["step"], r["task_id"], r["response_ids"])):
        advantages.setdefault((record["step"], record["task_id"]), []).append(
            (record["outcome"], per_turn_advantages(record)))
    return [m["update/grad_norm"] for m in metrics], advantages


def test_three_tiny_steps_give_the_pinned_gradient_norms_and_advantages(env_url, tmp_path):
    grad_norms, advantages = run_golden(env_url, tmp_path / "run")
    if os.environ.get("GOLDEN_PRINT"):
        print(f"\nGRAD_NORMS = {grad_norms!r}\nADVANTAGES = {advantages!r}")
    assert grad_norms == pytest.approx(GRAD_NORMS, rel=REL)
    assert list(advantages) == list(ADVANTAGES)  # the same tasks at each step
    for key, rollouts in advantages.items():
        assert [outcome for outcome, _ in rollouts] == [outcome for outcome, _ in ADVANTAGES[key]], key
        for (_, turns), (_, pinned) in zip(rollouts, ADVANTAGES[key], strict=True):
            assert turns == pytest.approx(pinned, rel=REL, abs=1e-7), key
