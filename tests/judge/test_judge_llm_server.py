"""The judge over real HTTP against the bundled `llm_server` (tiny random model and SmolLM2).

The bundled server has structured outputs, so `judge.llm.structured: auto` constrains the answer to the
label schema: even a random model then parses every step. With `structured: off` the text path is
what a hosted endpoint without structured outputs gets.
"""

from __future__ import annotations

import json

import pytest

from judge.agreement import DEFAULT_FIXTURE, load_fixture
from judge.client import JudgeClient, JudgeStep, JudgeTrajectory
from tests.helpers import ServiceProcess, run_service


def judge_conf(tmp_path, llm_url: str, model: str, structured: str = "auto", analysis: int | None = 60) -> str:
    """`analysis`: the longest analysis per step (None: the default)."""
    conf = tmp_path / "run.yaml"
    section = {"llm": {"base_url": llm_url + "/v1", "model": model, "max_retries": 0, "timeout": 600,
                       "structured": structured},
               "audit_log": str(tmp_path / "audit.jsonl")}
    if analysis is not None:
        section["max_analysis_chars"] = analysis
    conf.write_text(json.dumps({"judge": section}))
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


async def test_tiny_model_text_output_is_unparsable_so_every_trajectory_falls_back(
        tmp_path, tiny_server: ServiceProcess):
    # Judgments only: the retry carries the first answer, and the tiny model's context is 2,048 tokens
    # (a ~1,500-token prompt, the answer, the re-ask and the new answer's budget must fit it).
    conf = judge_conf(tmp_path, tiny_server.url, "tiny", structured="off", analysis=0)
    with run_service("judge", ["--conf", conf]) as judge:
        async with JudgeClient(judge.url) as client:
            trajs = flight_trajectories()
            response = await client.judge(trajs)
            stats = await client.stats()
    assert response.fallback_count == len(trajs) and response.raw_parse_rate == 0.0 and stats.llm_errors == 0
    for traj, judgment in zip(trajs, response.judgments, strict=True):
        assert judgment.fallback and judgment.attempts == 2  # one retry before giving up
        assert judgment.filled_steps == list(range(len(traj.steps)))
        sign = "GOOD" if traj.outcome > 0.5 else "BAD"
        assert [lab.label for lab in judgment.labels] == [sign] * len(traj.steps)
    assert response.usage.llm_calls == 4 and response.usage.completion_tokens > 0
    assert stats.fallback_rate == 1.0 and stats.unparsable_calls == 4 and stats.structured_calls == 0
    assert stats.filled_rate == 1.0


async def test_structured_outputs_make_even_a_random_model_parse(tmp_path, tiny_server: ServiceProcess):
    with run_service("judge", ["--conf", judge_conf(tmp_path, tiny_server.url, "tiny")]) as judge:
        async with JudgeClient(judge.url) as client:
            trajs = flight_trajectories()
            response = await client.judge(trajs)
            stats = await client.stats()
    assert response.raw_parse_rate == 1.0 and response.fallback_count == 0
    assert stats.structured_calls == 2 and stats.llm_calls == 2  # no retry: a constrained answer is complete
    assert stats.filled_steps == 0 and stats.budget_cut_calls == 0
    for traj, judgment in zip(trajs, response.judgments, strict=True):
        assert judgment.structured and judgment.parsed_labels == len(traj.steps)


@pytest.mark.slow
async def test_smollm2_parses_every_step_of_fixture_trajectories(tmp_path, smollm2_server: ServiceProcess):
    """Two ground-truth bfcl trajectories (a success and a failure); the full sets and the
    agreement with their labels are measured by benchmarks/science/judge.py."""
    test = load_fixture(DEFAULT_FIXTURE, split="test")
    # flights' own call syntax is covered by the eight-step test below; here bfcl's, success and failure.
    picked = [next(t for t in test if t.env == "bfcl" and t.source == source) for source in ("reference", "wrong_argument")]
    trajs = [JudgeTrajectory(trajectory_id=t.trajectory_id, task_id=t.task_id, query=t.query, outcome=t.outcome,
                             steps=[JudgeStep(action=s.action, observation=s.observation) for s in t.steps])
             for t in picked]
    with run_service("judge", ["--conf", judge_conf(tmp_path, smollm2_server.url, "smollm2")]) as judge:
        async with JudgeClient(judge.url) as client:
            response = await client.judge(trajs, timeout=600)
            stats = await client.stats()
    steps = sum(len(t.steps) for t in trajs)
    assert stats.steps == steps and stats.parsed_labels >= 0.99 * steps and response.raw_parse_rate >= 0.99
    assert stats.structured_calls == len(trajs) and stats.fallbacks == 0
    for traj, judgment in zip(trajs, response.judgments, strict=True):
        assert [lab.step for lab in judgment.labels] == list(range(len(traj.steps)))
        assert judgment.attempts == 1 and judgment.structured
    audit = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert len(audit) == len(trajs)


def eight_step_trajectory() -> JudgeTrajectory:
    """A failed flights episode of 8 steps, some of them wasted, in the agent's own call syntax."""
    calls = [
        ("get_passenger(name='Ana Silva')", '{"passenger_id": "P1001", "name": "Ana Silva", "balance": 420}'),
        ("search_flight(origin='SFO', destination='JFK')",
         '[{"flight_id": "UA2992-0603", "price": 389, "seats": 2}, {"flight_id": "DL120-0603", "price": 251, '
         '"seats": 0}, {"flight_id": "AA88-0603", "price": 305, "seats": 5}]'),
        ("search_flight(origin='SFO', destination='JFK')", "(the same three flights as before)"),
        ("book_ticket(flight_id='DL120-0603', passenger_id='P1001')", '{"error": "flight DL120-0603 is full"}'),
        ("get_passenger(name='Ana Silva')", '{"passenger_id": "P1001", "name": "Ana Silva", "balance": 420}'),
        ("book_ticket(flight_id='UA2992-0603', passenger_id='P1001')",
         '{"order_id": "O-77", "flight_id": "UA2992-0603", "price": 389}'),
        ("cancel_order(order_id='O-77')", '{"cancelled": "O-77", "refund": 389}'),
        ("I booked your flight from SFO to JFK.", ""),
    ]
    return JudgeTrajectory(trajectory_id="long", query="Book Ana Silva the cheapest flight from SFO to JFK that has a "
                                                       "free seat.", outcome=0.0,
                           steps=[JudgeStep(action=a, observation=o) for a, o in calls])


@pytest.mark.slow
async def test_smollm2_labels_every_step_of_an_eight_step_trajectory_at_the_default_budget(
        tmp_path, smollm2_server: ServiceProcess):
    """The output budget is the worst case of the label schema for the step count, so even full-length
    analyses of 8 steps are never cut by it."""
    traj = eight_step_trajectory()
    conf = judge_conf(tmp_path, smollm2_server.url, "smollm2", analysis=None)
    with run_service("judge", ["--conf", conf]) as judge:
        async with JudgeClient(judge.url) as client:
            response = await client.judge([traj], timeout=900)
            stats = await client.stats()
    judgment = response.judgments[0]
    assert response.raw_parse_rate == 1.0 and judgment.parsed_labels == 8 and judgment.filled_steps == []
    assert [lab.step for lab in judgment.labels] == list(range(8)) and not judgment.fallback
    assert stats.budget_cut_calls == 0 and stats.structured_calls == 1 and not judgment.budget_cut
    audit = json.loads((tmp_path / "audit.jsonl").read_text().splitlines()[0])
    answer = json.loads(audit["raw_outputs"][0])  # whole JSON, not a cut-off prefix
    assert list(answer) == [f"step_{i}" for i in range(8)]
    assert all(len(entry["analysis"]) <= 200 for entry in answer.values())
