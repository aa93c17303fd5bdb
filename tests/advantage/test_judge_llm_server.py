"""The judge over real HTTP against the bundled `llm_server` (tiny random model and SmolLM2)."""

from __future__ import annotations

import json

import pytest

from advantage.client import JudgeClient, JudgeStep, JudgeTrajectory
from tests.helpers import ServiceProcess, run_service


def judge_conf(tmp_path, llm_url: str, model: str) -> str:
    conf = tmp_path / "run.yaml"
    # Short generations keep the CPU test quick: two lines per step fit in 40 tokens.
    conf.write_text(json.dumps({"judge": {
        "llm": {"base_url": llm_url + "/v1", "model": model, "max_retries": 0, "timeout": 600},
        "audit_log": str(tmp_path / "audit.jsonl"), "max_tokens_per_step": 40}}))
    return str(conf)


def flight_trajectories() -> list[JudgeTrajectory]:
    query = "Book the cheapest flight from Boston to Denver on May 3."
    search = JudgeStep(action="search_flight(origin='BOS', destination='DEN', date='2025-05-03')",
                       observation="3 flights: UA12 $240, DL40 $199, AA7 $310")
    return [
        JudgeTrajectory(trajectory_id="win", query=query, outcome=1.0,
                        steps=[search, JudgeStep(action="book_ticket(flight='DL40')", observation="Booked DL40")]),
        JudgeTrajectory(trajectory_id="lose", query=query, outcome=0.0,
                        steps=[search, JudgeStep(action="book_ticket(flight='AA7')", observation="Booked AA7")]),
    ]


async def test_tiny_model_output_is_unparsable_so_every_trajectory_falls_back(tmp_path, tiny_server: ServiceProcess):
    with run_service("advantage.judge", ["--conf", judge_conf(tmp_path, tiny_server.url, "tiny")]) as judge:
        async with JudgeClient(judge.url) as client:
            trajs = flight_trajectories()
            response = await client.judge(trajs)
            stats = await client.stats()
    assert response.fallback_count == len(trajs) and response.raw_parse_rate == 0.0
    for traj, judgment in zip(trajs, response.judgments, strict=True):
        assert judgment.fallback and judgment.attempts == 2  # one retry before giving up
        assert judgment.filled_steps == list(range(len(traj.steps)))
        sign = "GOOD" if traj.outcome > 0.5 else "BAD"
        assert [lab.label for lab in judgment.labels] == [sign] * len(traj.steps)
    assert response.usage.llm_calls == 4 and response.usage.completion_tokens > 0
    assert stats.fallback_rate == 1.0 and stats.unparsable_calls == 4


@pytest.mark.slow
async def test_smollm2_judges_every_step(tmp_path, smollm2_server: ServiceProcess):
    """Completes with one label per step; the parse and fallback rates are measured by benchmarks/judge.py."""
    with run_service("advantage.judge", ["--conf", judge_conf(tmp_path, smollm2_server.url, "smollm2")]) as judge:
        async with JudgeClient(judge.url) as client:
            trajs = flight_trajectories()
            response = await client.judge(trajs, timeout=600)
    for traj, judgment in zip(trajs, response.judgments, strict=True):
        assert [lab.step for lab in judgment.labels] == list(range(len(traj.steps)))
        assert 1 <= judgment.attempts <= 2
    assert 0.0 <= response.raw_parse_rate <= 1.0
    audit = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert len(audit) == len(trajs)
