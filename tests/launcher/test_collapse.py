"""A real tiny-model run forced to collapse, as a user and the ablation harness meet it: `launcher.py` exits 4
without restarting the trainer, summary.json says `collapsed` and names the signal, the studio's run page
shows it, and the ablation harness records the run as failed and does not resume it.

The collapse is forced by the thresholds: the tiny random model's replies run to `max_new_tokens` at every
step, so with `reply_length_shrink: 1.0` (a median reply at most the baseline's breaches) every judged step
breaches `short_replies`, and the second one stops the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
import yaml

from benchmarks.science.ablation import Harness, derive, load_protocol
from benchmarks.science.ablation_report import failed_runs, load_results
from tests.helpers import REPO, InProcessServer

pytestmark = pytest.mark.slow

PROTOCOL = """
ablation:
  frozen: true
  seeds: [0]
  rows: [base, grpo]
  eval: {split: test, tasks: 2, k: 1, temperature: 1.0, concurrency: 4}
  curve: {tasks: 1}
  run_timeout_min: 5
  eval_threads: 1
run:
  launcher:
    services: [env_service, task_manager, experience_manager, judge]
    ports: {env_service: auto}
    threads: {default: 1, trainer: 1}
    restart: {max_restarts: 2, backoff_s: 0.2}   # a crash would be restarted: a collapse must not be
    ray: {enabled: false}
  env_service: {environments: {flights: {}}}
  task_manager: {environments: [flights], dedup: {embeddings: false}}
  judge: {llm: {base_url: "http://127.0.0.1:9/v1", model: unused}}
  trainer:
    model: tiny
    steps: 3
    tasks_per_step: 1
    progress: false
    tensorboard: false
    plot: false
    rollout: {env: flights, n: 2, max_turns: 2, max_new_tokens: 4, max_context: 1024, experience_ratio: 0.5}
    loss: {kl_coef: 0.01}
    advantage: {estimator: adca_grpo}
    collapse: {min_rollouts: 2, reply_length_shrink: 1.0}
"""


def test_a_collapsed_run_exits_4_unrestarted_and_is_recorded_as_failed(tmp_path):
    (tmp_path / "flights.yaml").write_text(PROTOCOL)
    protocol = load_protocol(tmp_path / "flights.yaml")
    runs_dir = tmp_path / "runs"
    config = derive(protocol.run, "grpo", 0, protocol.ablation, runs_dir)  # env_service and the trainer only
    config["trainer"]["eval"]["every"] = 0  # no curve: the run ends before its last step, where "after" would run
    conf = runs_dir / "grpo-seed0.yaml"
    conf.parent.mkdir(parents=True)
    conf.write_text(yaml.safe_dump(config))
    done = subprocess.run([sys.executable, "launcher.py", "--conf", str(conf)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    out = done.stdout + done.stderr
    assert done.returncode == 4, out[-4000:]
    assert "trainer failed: exited with code 4 (the run collapsed: its summary.json names the signal)" in out
    assert "trainer: collapsed: short_replies breached in 2 judged steps in a row (1, 2)" in out  # its own words
    assert "restart 1/" not in out and out.count("started trainer") == 1
    run_dir = runs_dir / "grpo-seed0"
    assert json.loads((run_dir / "manifest.json").read_text())["result"]["exit_code"] == 4

    summary = json.loads((run_dir / "trainer" / "summary.json").read_text())
    assert summary["status"] == "collapsed" and summary["steps"] == 2  # of 3: stopped at the collapse
    collapse = summary["collapse"]
    assert (collapse["signal"], collapse["step"], collapse["baseline_step"]) == ("short_replies", 2, 1)
    assert "short_replies breached in 2 judged steps in a row (1, 2)" in collapse["message"]
    checks = {c["check"]: c for c in summary["checks"]}
    assert checks["collapse"]["value"] == "short_replies at step 2" and checks["collapse"]["met"] is False
    records = [json.loads(line) for line in (run_dir / "trainer" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] > 0 and "collapse/rollouts" in r]
    assert [r["collapse/breaches"] for r in steps] == [1.0, 1.0]
    assert all(r["update/kl"] >= 0 for r in steps)  # the KL to the reference, per step

    from studio.app import build_app
    from studio.settings import StudioSettings

    with InProcessServer(build_app(StudioSettings(runs=str(runs_dir)), token="")) as studio:
        page = httpx.get(f"{studio.url}/runs/grpo-seed0", timeout=30).text
        listing = httpx.get(f"{studio.url}/", timeout=30).text
    assert '<span class="status collapsed">collapsed</span>' in page
    assert 'data-signal="short_replies"' in page and "Collapsed at step 2" in page
    assert '<span class="status collapsed">collapsed</span>' in listing

    # The harness finds the run collapsed: it records it as failed without starting the launcher again.
    harness = Harness(tmp_path / "flights.yaml", protocol, tmp_path / "results", runs_dir, explore=False)
    try:
        payload = harness.row("grpo", 0)
    finally:
        harness.close()
    assert payload["failed"]["reason"] == "collapsed" and payload["failed"]["signal"] == "short_replies"
    assert "eval_end" not in payload and not (runs_dir / "grpo-seed0.launcher.log").exists()
    # Run by hand again (the derived config resumes), the trainer restores the collapse from its checkpoint
    # and stops at once rather than train on.
    again = subprocess.run([sys.executable, "launcher.py", "--conf", str(conf)], cwd=REPO, capture_output=True,
                           text=True, timeout=300, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert again.returncode == 4, (again.stdout + again.stderr)[-4000:]
    assert "resumed from step_000002.pt" in (run_dir / "logs" / "trainer.log").read_text()
    assert json.loads((run_dir / "trainer" / "summary.json").read_text())["steps"] == 2
    assert load_results(tmp_path / "results") == {}
    assert [(f["row"], f["seed"], f["signal"]) for f in failed_runs(tmp_path / "results")] == [
        ("grpo", 0, "short_replies")]
