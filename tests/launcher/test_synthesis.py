"""Self-questioning before training: the gate runs real synthesis jobs on a real task manager over HTTP."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from evolver_launcher.synthesis import SynthesisFailed, SynthesisGate, main
from tests.helpers import REPO, run_service

pytestmark = pytest.mark.slow


def poll(gate: SynthesisGate, timeout: float = 180) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gate():
            return True
        time.sleep(0.2)
    return False


def test_gate_opens_after_the_jobs_and_reports_the_funnel_then_fails_on_a_bad_environment(tmp_path):
    conf = tmp_path / "run.yaml"
    conf.write_text(f"""
env_service: {{environments: {{flights: {{}}, signal: {{tasks_per_split: {{train: 0, validation: 4, test: 4}}}}}}}}
task_manager: {{environments: [flights, signal], store_dir: {tmp_path / 'tm'}, dedup: {{embeddings: false}}}}
""")
    with run_service("env_service", ["--conf", str(conf)]) as env, \
            run_service("task_manager", ["--conf", str(conf), "--env-url", env.url]) as tm:
        said: list[str] = []
        gate = SynthesisGate(tm.url, ["flights"], episodes=2, timeout_s=120, say=said.append)
        assert gate() is False, "closed while the job runs"
        assert poll(gate)
        funnel = gate.results["flights"]
        assert funnel["episodes_done"] == 2 and funnel["kept"] >= 1
        assert any(f"{funnel['kept']} kept" in line for line in said)

        again = SynthesisGate(tm.url, ["flights"], episodes=2, timeout_s=120, say=said.append)
        assert poll(again) and "flights" not in again.results, "a store that has synthetic tasks is not redone"
        assert "already in the store" in said[-1]

        # signal serves no train task to explore from: its job fails, and the gate says why.
        failing = SynthesisGate(tm.url, ["signal"], episodes=1, timeout_s=60, say=said.append)
        with pytest.raises(SynthesisFailed, match=r"synthesis job .* on signal ended failed"):
            poll(failing)


def conf_file(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_standalone_step_synthesizes_from_the_run_yaml_as_the_compose_trainer_runs_it(tmp_path, capsys):
    """`python -m evolver_launcher.synthesis --conf run.yaml` (the compose trainer's first command) finds the
    task manager by the trainer's task_url, exits 0 once the store has synthetic tasks, 1 when a job fails,
    and 2 naming the key when the YAML cannot say what to do."""
    env_conf = conf_file(tmp_path / "env.yaml", "env_service: {environments: {flights: {}, "
                                                   "signal: {tasks_per_split: {train: 0, validation: 4, test: 4}}}}")
    tm_conf = conf_file(tmp_path / "tm.yaml", f"""
task_manager: {{environments: [flights, signal], store_dir: {tmp_path / 'tm'}, dedup: {{embeddings: false}}}}
""")
    conf = tmp_path / "run.yaml"
    with run_service("env_service", ["--conf", str(env_conf)]) as env, \
            run_service("task_manager", ["--conf", str(tm_conf), "--env-url", env.url]) as tm:
        conf.write_text(f"""
launcher: {{synthesis: {{episodes: 2}}}}
task_manager: {{environments: [flights]}}
trainer: {{services: {{env_url: {env.url}, task_url: {tm.url}}}}}
""")
        done = subprocess.run([sys.executable, "-m", "evolver_launcher.synthesis", "--conf", str(conf)],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "exploring flights for 2 episodes" in done.stdout and "2 episodes," in done.stdout
        stats = httpx.get(f"{tm.url}/v1/stats", timeout=30).json()
        assert stats["environments"]["flights"]["synthetic"] >= 1

        # The rest in-process: main() is what `python -m` runs.
        assert main(["--conf", str(conf)]) == 0
        assert "already in the store (resumed run)" in capsys.readouterr().out
        assert main(["--conf", str(conf), "task_manager.environments=[signal]"]) == 1
        assert "on signal ended failed" in capsys.readouterr().err

    assert main(["--conf", str(conf), "launcher.synthesis.episodes=0"]) == 0
    assert "no self-questioning" in capsys.readouterr().out
    conf.write_text("launcher: {synthesis: {episodes: 2}}\ntask_manager: {environments: [flights]}\n")
    assert main(["--conf", str(conf)]) == 2
    assert "trainer.services.task_url" in capsys.readouterr().err
    assert main(["--conf", str(conf), "launcher.synthesis.seed_experience=true",
                 "trainer.services.task_url=http://127.0.0.1:9"]) == 2
    assert "trainer.services.experience_url" in capsys.readouterr().err
