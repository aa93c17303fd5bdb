"""The trajectory page shows a rollout's asks of the experience pool (query, hits with scores, over budget) and
the searches made before its steps, from the record the trainer writes, served over a real socket."""

from __future__ import annotations

import httpx

from common.schemas import ChatMessage, Step, Trajectory
from engine.models import load_tokenizer
from studio.app import build_app
from studio.settings import StudioSettings
from tests.helpers import InProcessServer
from trainer.asks import Hit, ask_record
from trainer.records import RolloutRecords
from trainer.rollout import Rollout
from trainer.step_batch import StepBatch
from trainer.templates import Segment


def asking_rollout(tokenizer) -> Rollout:
    ids = tokenizer.encode("book a flight", add_special_tokens=False)[:3]
    hit = Hit("exp_fares", 0.8125, "When a fare is asked: search_flight first.")
    steps = [
        Step(index=0, action=ChatMessage(role="assistant", content="search_experience(query='fare rules')"),
             observation=ChatMessage(role="tool", content='{"experiences": []}'),
             info={"ask": {**ask_record("fare rules", [hit], over_budget=False, withheld=False),
                           "branch": {"outcome_without": 0.0, "difference": 1.0, "state": "fork", "seconds": 0.4}}}),
        Step(index=1, action=ChatMessage(role="assistant", content="search_experience(query='again')"),
             observation=ChatMessage(role="tool", content="No answer: the budget is spent."),
             info={"ask": ask_record("again", [], over_budget=True, withheld=False)}),
        Step(index=2, action=ChatMessage(role="assistant", content="search_flight(origin='SFO')"),
             observation=ChatMessage(role="tool", content="[]"), done=True,
             info={"retrieval": {"query": "book a flight\n\n[]", "hits": [hit.record()]}}),
    ]
    response = ids * 3
    trajectory = Trajectory(trajectory_id="traj_ask", task_id="t1", group_id="g1", env_type="flights",
                            messages=[ChatMessage(role="user", content="book")], steps=steps, outcome=1.0,
                            prompt_ids=ids, response_ids=response, loss_mask=[1] * len(response),
                            step_ids=[0] * 3 + [1] * 3 + [2] * 3)
    return Rollout(trajectory, [Segment(ids, response, [1] * len(response), trajectory.step_ids)], asks=1,
                   asks_over_budget=1)


def test_the_trajectory_page_shows_asks_and_step_searches(tmp_path):
    tokenizer = load_tokenizer("tiny")
    trainer_dir = tmp_path / "runs" / "asking" / "trainer"
    rollout = asking_rollout(tokenizer)
    RolloutRecords(trainer_dir / "rollouts", tokenizer).write(
        1, StepBatch([[rollout]], advantages=[[0.5] * len(rollout.trajectory.response_ids)]))
    (trainer_dir / "config.json").write_text("{}")
    with InProcessServer(build_app(StudioSettings(runs=str(tmp_path / "runs")), token="")) as server:
        page = httpx.get(f"{server.url}/runs/asking/rollouts/traj_ask", timeout=30)
    assert page.status_code == 200, page.text[:500]
    html = page.text
    assert '<span class="asks" data-asks="1">1 ask(s), 1 over budget</span>' in html
    assert html.count('data-kind="ask"') == 2 and html.count('data-kind="retrieval"') == 1
    assert '<q class="search-query">fare rules</q>' in html and 'data-over-budget="true"' in html
    assert '<tr data-experience="exp_fares"><td><a href="/runs/asking/experiences/exp_fares">exp_fares</a></td>' in html
    assert '<td class="n">0.8125</td>' in html and "When a fare is asked: search_flight first." in html
    assert '<span class="role">answer</span>' in html and '<span class="role">ask</span>' in html
    assert "paired branch (fork): outcome without the answer 0, credit to this step 1" in html
