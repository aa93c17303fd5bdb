"""Self-questioning before training: the gate runs real synthesis jobs on a real task manager over HTTP."""

from __future__ import annotations

import time

import pytest

from evolver_launcher.synthesis import SynthesisFailed, SynthesisGate
from tests.helpers import run_service

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
env_service: {{environments: {{flights: {{}}, signal: {{}}}}}}
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

        # signal has no profile for exploration: its job fails, and the gate says why.
        failing = SynthesisGate(tm.url, ["signal"], episodes=1, timeout_s=60, say=said.append)
        with pytest.raises(SynthesisFailed, match=r"synthesis job .* on signal ended failed"):
            poll(failing)
