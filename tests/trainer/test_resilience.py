"""The experience peer across a SIGKILL of a real experience manager: after-step deliveries are
queued while it is down and delivered, each once, when it is back on the same port and store."""

from __future__ import annotations

import signal

import httpx
import pytest

from common.schemas import ChatMessage, Step, Trajectory
from tests.experience_manager.conftest import TASKS, chat_trajectory
from tests.helpers import free_port, run_service
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
