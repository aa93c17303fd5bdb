"""`python -m trainer --conf FILE` against a real env service: checkpoints, kill and resume, a full disk,
Ray actor."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.faults import DISK_FULL_ENV
from tests.helpers import REPO, run_env_service

ENV_YAML = "env_service:\n  environments:\n    signal: {fallback: first_char}\n"


def trainer_yaml(out: Path, env_url: str, *, steps: int, ray: bool = False, resume: bool = False,
                 export: Path | None = None, evals: bool = False) -> str:
    return f"""
trainer:
  model: tiny
  seed: 3
  steps: {steps}
  tasks_per_step: 2
  output_dir: {out}
  resume: {str(resume).lower()}
  torch_threads: 1
  progress: false
  export_dir: {export if export else 'null'}
  rollout: {{env: signal, n: 2, max_turns: 2, max_new_tokens: 2, max_context: 256}}
  optim: {{lr: 0.001, minibatches: 2, micro_batch_size: 2}}
  services: {{env_url: "{env_url}"}}
  eval: {{before: {str(evals).lower()}, after: {str(ray or evals).lower()}, tasks: 4}}
  checkpoint: {{every: 2, keep: 3}}
  ray: {{enabled: {str(ray).lower()}, dashboard: false, num_cpus: 0}}
"""


@pytest.fixture(scope="module")
def env_url(tmp_path_factory):
    with run_env_service(ENV_YAML, tmp_path_factory.mktemp("env")) as service:
        yield service.url


def start(conf: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as f:
        return subprocess.Popen([sys.executable, "-m", "trainer", "--conf", str(conf)], cwd=REPO, env=env,
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for_file(path: Path, proc: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    """Poll until the running trainer writes `path`; fail with its log if it exits first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {path} after {timeout}s"
        time.sleep(0.02)


def batches(out: Path) -> dict[int, dict]:
    """The last record of each step (a killed run may have logged a step it then redid)."""
    records = [json.loads(line) for line in (out / "batches.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in records}


def test_killed_run_resumes_at_the_checkpointed_step_and_cursor(env_url, tmp_path):
    straight = tmp_path / "straight"
    conf = tmp_path / "straight.yaml"
    conf.write_text(trainer_yaml(straight, env_url, steps=5, evals=True))
    proc = start(conf, tmp_path / "straight.log")
    assert proc.wait(timeout=240) == 0, (tmp_path / "straight.log").read_text()[-3000:]

    killed = tmp_path / "killed"
    conf = tmp_path / "killed.yaml"
    conf.write_text(trainer_yaml(killed, env_url, steps=5, evals=True))
    proc = start(conf, tmp_path / "killed.log")
    wait_for_file(killed / "checkpoints" / "step_000002.pt", proc, tmp_path / "killed.log")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    checkpoint_step = int((killed / "checkpoints" / "latest").read_text().strip()[5:11])
    assert checkpoint_step in (2, 4)

    conf = tmp_path / "resume.yaml"
    conf.write_text(trainer_yaml(killed, env_url, steps=5, resume=True, evals=True))
    proc = start(conf, tmp_path / "resume.log")
    assert proc.wait(timeout=240) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    log = (tmp_path / "resume.log").read_text()
    assert f"at step {checkpoint_step} " in log
    expected, got = batches(straight), batches(killed)
    assert sorted(got) == [1, 2, 3, 4, 5]
    # The resumed run continued from the saved data cursor: the same tasks as the uninterrupted run.
    for step in range(checkpoint_step + 1, 6):
        assert got[step]["task_ids"] == expected[step]["task_ids"]
        assert got[step]["cursor"] == expected[step]["cursor"]
    steps_logged = [json.loads(line)["step"] for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert steps_logged[-1] == 5
    # The held-out result from before training came back with the checkpoint: the summary pairs it with after.
    rows = {row["metric"]: row for row in json.loads((killed / "summary.json").read_text())["eval"]["rows"]}
    assert rows["avg@1"]["before"]["n"] == 4 and rows["avg@1"]["after"]["n"] == 4
    assert rows["avg@1"]["delta"]["n"] == 4
    straight_rows = {r["metric"]: r for r in json.loads((straight / "summary.json").read_text())["eval"]["rows"]}
    # Not redone on resume, yet equal to the uninterrupted run's (same weights at step 0, greedy).
    assert rows["avg@1"]["before"] == straight_rows["avg@1"]["before"]
    assert log.count("eval before training") == 0


def test_run_killed_in_its_first_step_resumes_without_evaluating_again(env_url, tmp_path):
    out = tmp_path / "run"
    conf = tmp_path / "run.yaml"
    conf.write_text(trainer_yaml(out, env_url, steps=1, evals=True).replace("every: 2", "every: 1"))
    proc = start(conf, tmp_path / "run.log")
    assert proc.wait(timeout=240) == 0, (tmp_path / "run.log").read_text()[-3000:]
    # As if killed during step 1: only the checkpoint written after the evaluation before training is left.
    checkpoints = out / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("step_*.pt")) == ["step_000000.pt", "step_000001.pt"]
    (checkpoints / "step_000001.pt").unlink()
    (checkpoints / "latest").write_text("step_000000.pt")

    conf.write_text(trainer_yaml(out, env_url, steps=1, evals=True, resume=True).replace("every: 2", "every: 1"))
    proc = start(conf, tmp_path / "resume.log")
    assert proc.wait(timeout=240) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    log = (tmp_path / "resume.log").read_text()
    assert "at step 0 " in log and "eval before training" not in log
    rows = {row["metric"]: row for row in json.loads((out / "summary.json").read_text())["eval"]["rows"]}
    assert rows["avg@1"]["delta"]["n"] == 4


def test_the_trainer_stops_on_a_full_disk_and_resumes_once_there_is_space(env_url, tmp_path, monkeypatch):
    """A full disk: exit 5 with a message naming the file and how to go on, the last checkpoint intact, and a
    resume from it once there is space. EVOLVER_DISK_FULL names a flag file: while it exists, the trainer's writes
    (rollout records, metrics, checkpoints) fail with ENOSPC."""
    out, flag = tmp_path / "run", tmp_path / "disk-full"
    monkeypatch.setenv(DISK_FULL_ENV, str(flag))
    conf = tmp_path / "run.yaml"
    conf.write_text(trainer_yaml(out, env_url, steps=2).replace("every: 2", "every: 1"))
    proc = start(conf, tmp_path / "full.log")
    wait_for_file(out / "checkpoints" / "step_000001.pt", proc, tmp_path / "full.log")
    flag.touch()
    assert proc.wait(timeout=240) == 5, (tmp_path / "full.log").read_text()[-3000:]
    log = (tmp_path / "full.log").read_text()
    assert "trainer: the disk is full (writing " in log and "run again with trainer.resume=true" in log
    assert not list((out / "checkpoints").glob("*.tmp")), "no half-written checkpoint is left taking space"
    saved = (out / "checkpoints" / "latest").read_text().strip()

    flag.unlink()
    conf.write_text(trainer_yaml(out, env_url, steps=2, resume=True).replace("every: 2", "every: 1"))
    proc = start(conf, tmp_path / "resume.log")
    assert proc.wait(timeout=240) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    assert f"at step {int(saved[5:11])} " in (tmp_path / "resume.log").read_text()
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sorted(set(steps)) == [1, 2]


def test_trainer_runs_as_a_ray_actor_and_exports(env_url, tmp_path):
    out, export = tmp_path / "ray", tmp_path / "export"
    conf = tmp_path / "ray.yaml"
    conf.write_text(trainer_yaml(out, env_url, steps=2, ray=True, export=export))
    log = tmp_path / "ray.log"
    proc = start(conf, log)
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "Ray actor TrainerActor" in text
    # The actor asks Ray for the GPU its device needs (none here, or one), and says which device it took.
    assert re.search(r"Ray actor TrainerActor \(0(\.0)? CPU, [01] GPU\)", text)
    assert re.search(r"trainer\.device: auto -> (cpu|cuda)", text)
    summary = json.loads(text.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["dropped_groups"] == 0
    assert (out / "learning_curves.png").stat().st_size > 0
    assert list((out / "tensorboard").iterdir())
    assert (export / "config.json").is_file()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert "eval/avg@1" in records[-1] and "eval/invalid_action_rate" in records[-1]


def test_bad_config_names_the_key(tmp_path):
    conf = tmp_path / "bad.yaml"
    conf.write_text("trainer:\n  stpes: 3\n  rollout: {env: signal}\n  services: {env_url: 'http://x'}\n")
    result = subprocess.run([sys.executable, "-m", "trainer", "--conf", str(conf)], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "trainer.stpes: unknown key" in result.stderr


def test_mechanisms_need_their_services():
    from pydantic import ValidationError

    from trainer.config import TrainerConfig

    base = {"rollout": {"env": "signal"}, "services": {"env_url": "http://x"}}
    with pytest.raises(ValidationError, match="adca_grpo needs step labels: set services.judge_url"):
        TrainerConfig.model_validate({**base, "advantage": {"estimator": "adca_grpo"}})
    with pytest.raises(ValidationError, match="experience_ratio > 0 needs services.experience_url"):
        TrainerConfig.model_validate({**base, "rollout": {"env": "signal", "experience_ratio": 0.5}})
    TrainerConfig.model_validate({**base, "advantage": {"estimator": "adca_grpo"},
                                  "services": {"env_url": "http://x", "judge_url": "http://j"}})
