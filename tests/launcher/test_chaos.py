"""Chaos in CI: during one launcher run, SIGKILL each service once and then the trainer.

The run must finish all its steps and write its summary; no step may be empty; the trainer's
counters must show an outage of each service (each one survived) and the trainer's resume; nothing
the experience manager or the task manager acknowledged before its kill may be missing after it.
The driver is `benchmarks/services/chaos.py` (which also prints what each outage cost).
"""

from __future__ import annotations

import pytest

from benchmarks.services.chaos import SERVICES, run_chaos

pytestmark = pytest.mark.slow

STEPS = 36  # the six kills end near step 20 on 2 cores; the rest is margin for an engine with shorter steps


def test_a_run_rides_through_a_sigkill_of_every_service_and_of_the_trainer(tmp_path):
    result = run_chaos(tmp_path, steps=STEPS, backoff_s=3.0)
    log = open(result["log"], errors="replace").read()
    assert result["exit_code"] == 0, log[-5000:]
    assert result["summary_steps"] == STEPS, "summary.json is written with every step done"
    assert [k["child"] for k in result["kills"][:-1]] == [*SERVICES, "trainer"]
    assert result["empty_steps"] == [], "no step trained on nothing"
    assert set(range(1, STEPS + 1)) <= set(result["logged_steps"])
    assert result["lost"] == [], "nothing acknowledged before a kill is lost"
    resilience = result["resilience"]
    for service in SERVICES:
        counters = resilience["outages"][service]
        assert counters["outages"] >= 1, (service, resilience)
        assert counters["survived"] == counters["outages"], (service, resilience)
        assert counters["gave_up"] == 0 or service == "judge", (service, resilience)
        assert counters["waited_s"] > 0, (service, resilience)
    assert resilience["resumes"] == 1, "the launcher restarted the trainer once, from its checkpoint"
    assert resilience["empty_step_retries"] == 0
    assert "trainer exited with code -9; restart 1/2" in log
    assert "trainer.resume=true" in open(f"{result['run_dir']}/logs/trainer.log", errors="replace").read()
