"""The engine in-process (real Qdrant local mode and MiniLM): pool cap, dedup against archived advice."""

from __future__ import annotations

import pytest

from experience_manager.engine import ExperienceEngine
from experience_manager.settings import ExperienceManagerSettings
from experience_manager.trajectories import build_view
from tests.experience_manager.conftest import TASKS, chat_trajectory

pytestmark = pytest.mark.slow


def _views(task_id: str, query: str, calls, reward: float = 1.0):
    traj = chat_trajectory(task_id, query, calls, reward)
    return [build_view(messages=traj["messages"], reward=reward, success_threshold=1.0, trajectory_id=None,
                       task_id=task_id, query=None)]


async def test_pool_cap_archives_the_least_useful_and_archived_advice_stays_archived(tmp_path):
    settings = ExperienceManagerSettings(store=str(tmp_path / "store"), scoring={"max_active": 3})
    engine = ExperienceEngine(settings)
    await engine.start()
    try:
        first = await engine.ingest.summarize("ws", [v for t, q, c, _ in TASKS[:3] for v in _views(t, q, c)],
                                              mode="heuristic", request_id=None, digest="a")
        weak = first["created"][1]
        await engine.feedback("ws", [{"experience_ids": [weak], "reward": 0.0}] * 2, request_id=None, digest="b")
        task_id, query, calls, _ = TASKS[3]
        second = await engine.ingest.summarize("ws", _views(task_id, query, calls), mode="heuristic",
                                               request_id=None, digest="c")
        assert second["archived"] == [weak] and len(second["created"]) == 1
        stats = engine.workspace_stats("ws")
        assert stats["active"] == 3 and stats["archived"] == 1

        # The same task distilled again matches the archived experience: support grows, it stays archived.
        again = await engine.ingest.summarize("ws", _views(*TASKS[1][:3]), mode="heuristic", request_id=None,
                                              digest="d")
        assert again["created"] == [] and again["merged"][0]["into"] == weak
        assert engine.store.index("ws").experiences[weak].status == "archived"
        assert engine.store.index("ws").experiences[weak].support == 2
    finally:
        await engine.close()
