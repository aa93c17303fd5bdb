"""A new estimator that needs step labels, registered from outside the package, trains a step.

Its file (`outside_estimator.py`) is all it takes: the trainer config accepts its name and settings,
refuses a run without a judge (its declared need), asks the judge once per batch, and the update gets
the estimator's advantages. A second case declares one through the `evolver.estimators` entry-point group
of an installed distribution, which the launcher reads without importing torch.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import REPO, run_env_service, run_service
from tests.judge.fake_judge_llm import fake_judge_llm
from tests.trainer import outside_estimator  # noqa: F401  (registers "step_sign")
from trainer.config import TrainerConfig
from trainer.local import LocalTrainer

ENV_YAML = """env_service:
  environments:
    signal:
      options: [north, south]
      tasks_per_split: {train: 4, validation: 2, test: 2}
"""


def config(tmp_path, env_url: str, judge_url: str | None) -> dict:
    services = {"env_url": env_url, **({"judge_url": judge_url} if judge_url else {})}
    return {
        "model": "tiny", "seed": 0, "steps": 1, "tasks_per_step": 2, "output_dir": str(tmp_path / "run"),
        "torch_threads": 1, "progress": False, "tensorboard": False, "plot": False,
        "rollout": {"env": "signal", "n": 2, "max_turns": 2, "max_new_tokens": 4, "max_context": 512},
        "optim": {"lr": 1e-4, "minibatches": 1, "micro_batch_size": 4},
        "advantage": {"estimator": "step_sign", "options": {"step_sign": {"scale": 2.0}}},
        "services": services, "eval": {"before": False, "after": False, "tasks": 1}, "ray": {"enabled": False},
    }


def test_its_declared_need_is_checked_and_its_settings_validated(tmp_path):
    with pytest.raises(ValueError, match="step_sign needs step labels"):
        TrainerConfig.model_validate(config(tmp_path, "http://127.0.0.1:9", None))
    bad = config(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9")
    bad["advantage"]["options"]["step_sign"] = {"scale": -1}
    with pytest.raises(ValueError, match="scale"):
        TrainerConfig.model_validate(bad)
    unknown = config(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9")
    unknown["advantage"]["estimator"] = "step_sine"
    with pytest.raises(ValueError, match="unknown advantage estimator 'step_sine'.*step_sign"):
        TrainerConfig.model_validate(unknown)


@pytest.mark.slow
def test_it_trains_a_step_with_judge_labels(tmp_path):
    with fake_judge_llm() as (llm_url, llm_calls), run_env_service(ENV_YAML, tmp_path) as env:
        (tmp_path / "judge.yaml").write_text(json.dumps({"judge": {
            "llm": {"base_url": llm_url, "model": "fake", "max_retries": 0}, "audit_log": str(tmp_path / "a.jsonl")}}))
        with run_service("judge", ["--conf", str(tmp_path / "judge.yaml")]) as judge:
            trainer = LocalTrainer(TrainerConfig.model_validate(config(tmp_path, env.url, judge.url)))
            samples: list = []

            async def step() -> dict:
                await trainer.setup()
                update = trainer.updater.update
                trainer.updater.update = lambda batch, **kw: (samples.extend(batch), update(batch, **kw))[1]
                try:
                    return await trainer.train_step()
                finally:
                    await trainer.close()

            metrics = asyncio.run(step())
    assert trainer.step == 1 and math.isfinite(metrics["update/pg_loss"])  # a real update ran
    assert trainer.mechanisms.judge.counters.batches == 1 and trainer.mechanisms.judge.counters.trajectories == 4
    # Every policy token carries scale x its step's label (the fake judge says BAD unless the action is "useful").
    policy_advantages = [a for s in samples for a, m in zip(s.advantages, s.loss_mask, strict=True) if m]
    assert policy_advantages and set(policy_advantages) <= {2.0, -2.0}


def test_an_installed_package_declares_one_by_entry_point_without_torch(tmp_path):
    (tmp_path / "my_estimators.py").write_text(textwrap.dedent('''
        from estimators import EstimatorSpec, GrpoConfig
        SPEC = EstimatorSpec("my_labels", GrpoConfig, needs={"step_labels"}, target="my_estimators_math:run")
    '''))
    dist = tmp_path / "my_estimators-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-estimators\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[evolver.estimators]\nmy_labels = my_estimators:SPEC\n")
    code = textwrap.dedent('''
        import sys
        from estimators import AdvantageConfig, catalog
        config = AdvantageConfig(estimator="my_labels")
        assert config.needs_step_labels and catalog.verl_name("my_labels") == "evolver_my_labels"
        assert catalog.from_verl_name("evolver_my_labels") == "my_labels"
        print(sorted(m for m in ("torch", "verl") if m in sys.modules))
    ''')
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": f"{REPO}:{tmp_path}"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
