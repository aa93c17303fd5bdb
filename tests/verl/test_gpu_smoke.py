"""The GPU scripts that can run here: `gpu_smoke.sh --dry-run` (services, task parquets, veRL's config with our
overrides, no training) and the GPU image's default command, which is the script that dry run drives."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("verl", reason="veRL is installed by the `verl` extra")

from tests.helpers import REPO  # noqa: E402

RECIPE = "examples/run_overall_gpu.sh"


def image_command() -> list[str]:
    """The CMD of docker/Dockerfile.gpu (its exec form, a JSON list)."""
    lines = [line for line in (REPO / "docker" / "Dockerfile.gpu").read_text().splitlines() if line.startswith("CMD ")]
    assert len(lines) == 1, lines
    return json.loads(lines[0][len("CMD "):])


def test_the_gpu_image_runs_the_verl_recipe_which_the_smoke_dry_run_drives():
    # Not launcher.py: it runs the local trainer only and refuses a YAML with a `verl` section.
    assert image_command() == ["bash", RECIPE]
    assert RECIPE in (REPO / "benchmarks" / "speed" / "gpu_smoke.sh").read_text()


def test_gpu_smoke_dry_run_starts_the_services_writes_the_data_and_verl_accepts_the_overrides(tmp_path):
    run_dir = tmp_path / "smoke"
    env = {**os.environ, "RUN_DIR": str(run_dir), "PYTHON": sys.executable, "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": str(REPO)}
    done = subprocess.run(["bash", "benchmarks/speed/gpu_smoke.sh", "--dry-run"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    log = (run_dir / "run.log").read_text() if (run_dir / "run.log").exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + log[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["mode"], result["status"]) == ("dry_run", "ok")
    assert "started env_service" in log and "started experience_manager" in log
    assert (run_dir / "data" / "train.parquet").is_file() and (run_dir / "data" / "validation.parquet").is_file()
    config = (run_dir / "verl_config.yaml").read_text()  # veRL composed its config with our overrides
    for ours in ("trainer_mode: evolver_sync", "default_agent_loop: evolver_env_agent", "loss_mode: evolver_boosted",
                 "adv_estimator: evolver_grpo"):
        assert ours in config, ours
