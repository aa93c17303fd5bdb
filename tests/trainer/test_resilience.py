"""The trainer's peers across real SIGKILLs.

- experience manager: after-step deliveries are queued while it is down and delivered, each once,
  when it is back on the same port and store;
- env_service gone for good: the step's groups are all dropped, the step is collected again
  `empty_step_retries` times and the run fails with exit 3 naming the cause (the peer, its log),
  without logging an empty step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from common.schemas import ChatMessage, Step, Trajectory
from tests.experience_manager.conftest import TASKS, chat_trajectory
from tests.helpers import REPO, free_port, killed_at_exit, run_env_service, run_service, write_trainer_conf
from trainer.peers import ExperiencePeer, OutagePolicy

pytestmark = pytest.mark.slow


def _rollouts() -> list[list[Trajectory]]:
    """Two groups of two: the first rollout of each was given experience."""
    groups = []
    for task_id, query, calls, _ in TASKS[:2]:
        group = []
        for flagged, reward in ((True, 1.0), (False, 0.0)):
            t = Trajectory.model_validate(chat_trajectory(task_id, query, calls, reward))
            t.steps = [Step(index=0, action=ChatMessage(role="assistant", content="x"))]
            t.experience_flag, t.experience_ids = flagged, []
            group.append(t)
        groups.append(group)
    return groups


async def test_deliveries_wait_for_a_killed_experience_manager_and_arrive_once(tmp_path):
    port, store = free_port(), str(tmp_path / "store")
    args = ["--store", store]
    with run_service("experience_manager", args, port=port) as first:
        seeded = httpx.post(f"{first.url}/v1/workspaces/ws/experiences", timeout=60, json={
            "when_to_use": "when booking a flight", "content": "search before booking"}).json()
        used = seeded["experience"]["experience_id"]
        peer = ExperiencePeer(first.url, "ws", summarize_mode="heuristic",
                              outage=OutagePolicy(budget_s=120, logs_dir=str(tmp_path)))
        first.stop(signal.SIGKILL)
    groups = _rollouts()
    for group in groups:
        group[0].experience_ids = [used]
    await peer.after_step(groups, summarize=True, feedback=True, request_id="run-step0")
    assert [p.kind for p in peer.pending] == ["feedback", "summarize"], "queued, training went on"
    assert peer.counters.queued_deliveries == 2 and peer.counters.feedback_items == 0
    with run_service("experience_manager", args, port=port) as second:
        await peer.deliver_pending()
        await peer.deliver_pending()  # nothing left: a second flush sends nothing twice
        usage = httpx.get(f"{second.url}/v1/workspaces/ws/experiences/{used}", timeout=60).json()["usage"]
        stats = httpx.get(f"{second.url}/v1/workspaces/ws/stats", timeout=60).json()
    await peer.aclose()
    assert peer.pending == [] and peer.counters.delivered_late == 2
    assert peer.counters.feedback_items == 2 and peer.counters.summarized_trajectories == 4
    assert usage["uses"] == 2, "both experience-given rollouts reported once"
    assert stats["active"] >= 2, "the seeded experience survived the kill and the summaries arrived"
    [line] = peer.degradations()
    assert "2 summarize/feedback deliveries queued" in line and "2 delivered later, 0 undelivered" in line


def test_a_step_with_every_group_dropped_is_retried_then_fails_naming_the_peer(tmp_path):
    out, logs = tmp_path / "out", tmp_path / "logs"
    with run_env_service("env_service:\n  environments:\n    signal: {fallback: first_char}\n", tmp_path) as env:
        conf = write_trainer_conf(
            tmp_path / "trainer.yaml", steps=1000, output_dir=str(out), empty_step_retries=2,
            rollout={"env": "signal", "n": 2, "max_turns": 2, "max_new_tokens": 2, "max_context": 256, "retries": 1},
            services={"env_url": env.url, "outage_budget_s": 0.5, "logs_dir": str(logs)})
        log = tmp_path / "trainer.log"
        with log.open("wb") as f:
            proc = subprocess.Popen([sys.executable, "-m", "trainer", "--conf", str(conf)], cwd=REPO,
                                    env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        with killed_at_exit(proc):
            deadline = time.monotonic() + 180
            while not ((out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").read_text().strip()):
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.1)
            env.stop(signal.SIGKILL)  # and nobody restarts it
            code = proc.wait(timeout=180)
    text = log.read_text()
    assert code == 3, text[-3000:]
    assert "all 2 task groups were dropped in 3 attempts" in text
    assert "env_service" in text and f"{logs}/env_service.log" in text and "outage budget" in text
    assert text.count("collecting it again") == 2
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records and all(r["rollout/groups"] >= 1 for r in records), "no empty step was logged"
