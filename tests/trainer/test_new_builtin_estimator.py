"""A new built-in estimator is one file with one declaration, and the launcher still loads no torch.

The test drops one module, `centred.py` (an `@estimator` declaration and its function), beside the
built-ins in a copy of the `estimators` package, then in a fresh interpreter that imports that copy:
`import launcher` and the catalog know the new estimator and its `advantage.centred` section without
torch, and the tiny model trains a step with it against the env service over HTTP, its advantages
being the estimator's (scale x (outcome - the group's mean outcome), on every policy token).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

from tests.helpers import REPO

NEW_ESTIMATOR = '''
"""Centred outcome: scale x (outcome - the group's mean outcome), on every policy token."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from estimators.result import AdvantageResult
from estimators.spec import estimator
from estimators.tokens import broadcast_rows
from common.config import StrictModel


class CentredConfig(StrictModel):
    scale: float = Field(default=1.0, gt=0)


@estimator("centred", CentredConfig)
def centred(batch, config: CentredConfig, training_step: int) -> AdvantageResult:
    outcome = batch.outcome.detach().double().cpu().numpy()
    scores = np.zeros_like(outcome)
    for rows in batch.groups():
        scores[rows] = config.scale * (outcome[rows] - outcome[rows].mean())
    return AdvantageResult(advantages=broadcast_rows(batch, scores))
'''

CHILD = '''
import asyncio, json, sys

import launcher
from estimators import AdvantageConfig, catalog

assert "centred" in catalog.names() and catalog.verl_name("centred") == "evolver_centred"
assert AdvantageConfig(estimator="centred", centred={"scale": 2.0}).estimator_config().scale == 2.0
print(json.dumps({"heavy": sorted(m for m in ("torch", "transformers", "verl") if m in sys.modules)}))

from env_service.app import build_app
from env_service.settings import EnvServiceSettings
from tests.helpers import InProcessServer
from trainer.config import TrainerConfig
from trainer.local import LocalTrainer

OUT = sys.argv[1]
env = EnvServiceSettings(environments={"signal": {"options": ["north", "south"], "fallback": "first_char",
                                                  "tasks_per_split": {"train": 4, "validation": 2, "test": 2}}})
with InProcessServer(build_app(env)) as server:
    config = TrainerConfig.model_validate({
        "model": "tiny", "seed": 0, "steps": 1, "tasks_per_step": 2, "output_dir": OUT,
        "torch_threads": 1, "progress": False, "tensorboard": False, "plot": False,
        "rollout": {"env": "signal", "n": 4, "max_turns": 2, "max_new_tokens": 2, "max_context": 256},
        "advantage": {"estimator": "centred", "centred": {"scale": 2.0}},
        "optim": {"minibatches": 1, "micro_batch_size": 8},
        "services": {"env_url": server.url}, "eval": {"before": False, "after": False, "tasks": 1},
        "ray": {"enabled": False}})

    async def one_step():
        trainer = LocalTrainer(config)
        await trainer.setup()
        try:
            return await trainer.train_step()
        finally:
            await trainer.close()

    metrics = asyncio.run(one_step())
print(json.dumps({"optimizer_steps": metrics["update/optimizer_steps"]}))
'''


def test_a_new_builtin_is_one_module_and_trains_a_step_without_torch_in_the_launcher(tmp_path):
    copy = tmp_path / "src"
    shutil.copytree(REPO / "estimators", copy / "estimators", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "estimators" / "builtin" / "centred.py").write_text(NEW_ESTIMATOR)
    out = tmp_path / "run"
    # The copy comes first on the path, so it is the `estimators` package the child imports.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(copy), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), str(out)], cwd=copy, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines[0] == {"heavy": []}  # launcher, catalog and config: no torch
    assert lines[1]["optimizer_steps"] >= 1  # a real update ran

    records = [json.loads(line) for shard in (out / "rollouts").glob("shard-*.jsonl")
               for line in shard.read_text().splitlines()]
    assert len(records) == 8
    by_group: dict[str, list[dict]] = {}
    for record in records:
        by_group.setdefault(record["group_id"], []).append(record)
    for group in by_group.values():
        mean = sum(r["outcome"] for r in group) / len(group)
        for record in group:
            trained = {a for a, m in zip(record["advantages"], record["loss_mask"], strict=True) if m}
            assert trained == {2.0 * (record["outcome"] - mean)}
    assert any(r["outcome"] != records[0]["outcome"] for r in records)  # some group had a signal to centre
