"""The judge service over real HTTP, with a test double of the hosted judge LLM.

The double (tests/judge/fake_judge_llm.py) labels a step GOOD when its action says "useful";
a `[mode=...]` tag in the task text makes it misbehave in a chosen way.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from common.http import ServiceCallError
from common.schemas import ChatMessage, Step, Trajectory
from estimators import batch_from_trajectories, compute_advantages
from judge.client import JudgeClient, judgments_by_id
from tests.helpers import REPO, free_port, run_service
from tests.judge.fake_judge_llm import fake_judge_llm
from trainer.peers import JudgePeer


@pytest.fixture(scope="module")
def fake_llm():
    with fake_judge_llm() as (url, calls):
        yield url, calls


@pytest.fixture(scope="module")
def judge(fake_llm, tmp_path_factory):
    url, _ = fake_llm
    work = tmp_path_factory.mktemp("judge")
    conf = work / "run.yaml"
    conf.write_text(json.dumps({"judge": {
        "llm": {"base_url": url, "model": "fake-judge", "max_retries": 0, "timeout": 20},
        "audit_log": str(work / "audit.jsonl"), "max_concurrency": 4,
    }}))
    with run_service("judge", ["--conf", str(conf)], timeout=60) as service:
        service.audit = work / "audit.jsonl"
        yield service


def trajectory(tid: str, group: str, actions: list[str], outcome: float, query: str) -> Trajectory:
    """A rollout whose step s spans two policy tokens followed by one observation token."""
    steps = [Step(index=s, action=ChatMessage(role="assistant", content=a),
                  observation=ChatMessage(role="user", content=f"result of {a}")) for s, a in enumerate(actions)]
    step_ids, mask = [], []
    for s in range(len(actions)):
        step_ids += [s, s, -1]
        mask += [1, 1, 0]
    return Trajectory(trajectory_id=tid, task_id=group, group_id=group, steps=steps, outcome=outcome,
                      messages=[ChatMessage(role="user", content=query)], response_ids=list(range(len(mask))),
                      loss_mask=mask, step_ids=step_ids)


async def test_labels_parse_and_map_to_adca_advantages(judge, fake_llm):
    _, calls = fake_llm
    before = len(calls)
    q = "Find a cheap flight to Paris."
    trajs = [
        trajectory("a0", "g1", ["useful search", "idle chatter", "useful booking"], 1.0, q),
        trajectory("a1", "g1", ["idle chatter", "wrong booking"], 0.0, q),
        trajectory("a2", "g1", ["useful booking"], 1.0, q),
    ]
    async with JudgeClient(judge.url) as client:
        response = await client.judge_trajectories(trajs)
    assert len(calls) - before == 3
    assert [j.trajectory_id for j in response.judgments] == ["a0", "a1", "a2"]
    labels = [[lab.label for lab in j.labels] for j in response.judgments]
    assert labels == [["GOOD", "BAD", "GOOD"], ["BAD", "BAD"], ["GOOD"]]
    assert all(not j.fallback and not j.filled_steps and j.attempts == 1 for j in response.judgments)
    assert response.raw_parse_rate == 1.0 and response.fallback_count == 0
    assert response.usage.llm_calls == 3 and response.usage.prompt_tokens > 0
    assert response.judgments[0].labels[0].reason.startswith("the step did")
    assert {j.source for j in response.judgments} == {"llm"}  # no labeller: reference_rule, no reference: true

    # End to end: the judgments by trajectory, then ADCA-GRPO on the token batch of the labelled trajectories.
    # These are the labels and outcomes of group a in test_estimators_hand.py: z(GOOD)=8/sqrt(80), z(BAD)=-10/sqrt(80),
    # outcome z = 1/sqrt2, -sqrt2, 1/sqrt2.
    judgments = judgments_by_id(trajs, response)
    assert judgments["a0"].source == "llm"
    # The trainer's side gets the same judgments back and counts the labels by source for its summary.
    peer = JudgePeer(judge.url)
    again = await peer.label(trajs)
    assert {k: j.labels for k, j in again.items()} == {k: j.labels for k, j in judgments.items()}
    assert all(t.labels is None for t in trajs), "the judge returns labels, the trajectories stay as they were"
    await peer.aclose()
    assert peer.summary()["labels_by_source"] == {"llm": 6}
    labelled = [t.model_copy(update={"labels": judgments[t.trajectory_id].labels}) for t in trajs]
    adv = compute_advantages("adca_grpo", batch_from_trajectories(labelled), {"alpha": 0.1})
    g, b, o = 0.8 / math.sqrt(80), -1.0 / math.sqrt(80), [1 / math.sqrt(2), -math.sqrt(2), 1 / math.sqrt(2)]
    a0 = [g + b + g + o[0], b + g + o[0], g + o[0]]
    a1 = [b + b + o[1], b + o[1]]
    a2 = [g + o[2]]
    want = torch.tensor([
        [a0[0], a0[0], 0, a0[1], a0[1], 0, a0[2], a0[2], 0],
        [a1[0], a1[0], 0, a1[1], a1[1], 0, 0, 0, 0],
        [a2[0], a2[0], 0, 0, 0, 0, 0, 0, 0],
    ])
    assert torch.allclose(adv, want, atol=1e-6)


async def test_reconciliation_retry_fallback_and_cache(judge, fake_llm):
    _, calls = fake_llm
    trajs = [
        trajectory("one", "g2", ["useful a", "b"], 1.0, "[mode=one_based] task"),
        trajectory("part", "g2", ["a", "useful b", "c"], 0.0, "[mode=partial] task"),
        trajectory("retry", "g2", ["useful a", "b"], 1.0, "[mode=garbage_then_well] task"),
        trajectory("junk", "g2", ["useful a", "b"], 0.0, "[mode=garbage] task"),
        trajectory("down", "g2", ["useful a"], 1.0, "[mode=error] task"),
        trajectory("fine", "g2", ["useful a", "b"], 1.0, "plain task"),
    ]
    before = len(calls)
    async with JudgeClient(judge.url) as client:
        response = await client.judge_trajectories(trajs)
        by_id = {j.trajectory_id: j for j in response.judgments}

        one = by_id["one"]
        assert [lab.label for lab in one.labels] == ["GOOD", "BAD"] and not one.fallback
        assert any("numbered from 1" in note for note in one.reconciliation)

        part = by_id["part"]  # only step 0 judged, twice (one retry); steps 1, 2 filled with BAD (failure)
        assert [lab.label for lab in part.labels] == ["BAD", "BAD", "BAD"] and not part.fallback
        assert part.parsed_labels == 1 and part.filled_steps == [1, 2] and part.attempts == 2
        assert "filled with BAD" in part.reconciliation[-1]

        retry = by_id["retry"]
        assert [lab.label for lab in retry.labels] == ["GOOD", "BAD"] and retry.attempts == 2
        assert not retry.fallback and retry.parsed_labels == 2

        junk = by_id["junk"]  # unparsable twice: every step gets the outcome's sign (failure: BAD)
        assert junk.fallback and junk.attempts == 2 and junk.parsed_labels == 0
        assert [lab.label for lab in junk.labels] == ["BAD", "BAD"] and junk.filled_steps == [0, 1]
        assert "unparsable" in junk.error

        down = by_id["down"]  # the LLM answers 500: fallback, but the batch still succeeds
        assert down.fallback and [lab.label for lab in down.labels] == ["GOOD"] and "HTTP 500" in down.error

        assert not by_id["fine"].fallback
        assert response.fallback_count == 2
        # parsed: 2 + 1 + 2 + 0 + 0 + 2 of 12 steps
        assert response.raw_parse_rate == pytest.approx(7 / 12)
        # calls: one 1, part 2, retry 2, junk 2, down 2 (each failing call is tried once), fine 1
        assert len(calls) - before == 10

        # The same batch again: answered from the cache (the failed LLM call is not cached).
        again = await client.judge_trajectories(trajs)
        cached = {j.trajectory_id: j.cached for j in again.judgments}
        assert cached == {"one": True, "part": True, "retry": True, "junk": True, "down": False, "fine": True}
        assert again.judgments[3].fallback and again.usage.cache_hits == 5
        assert len(calls) - before == 12  # only "down" went to the LLM again

        # Identical trajectories in one batch (a GRPO group of equal rollouts) cost one LLM call.
        twins = [trajectory(f"twin{i}", "g3", ["useful x"], 1.0, "twin task") for i in range(4)]
        before = len(calls)
        twin_response = await client.judge_trajectories(twins)
        assert len(calls) - before == 1 and twin_response.usage.cache_hits == 3

        stats = await client.stats()
    assert stats.fallbacks >= 3 and 0 < stats.fallback_rate < 1
    assert stats.successful.steps > 0 and stats.failed.steps > 0
    assert stats.successful.good_rate > stats.failed.good_rate
    assert stats.llm_errors >= 4 and stats.unparsable_calls >= 3

    metrics = httpx.get(f"{judge.url}/metrics").text
    assert 'evolver_judge_llm_tokens_total{kind="prompt"}' in metrics
    assert 'evolver_judge_trajectories_total{result="fallback"}' in metrics
    audit = [json.loads(line) for line in Path(judge.audit).read_text().splitlines()]
    junk_lines = [r for r in audit if r["trajectory_id"] == "junk"]
    assert junk_lines[0]["fallback"] and len(junk_lines[0]["raw_outputs"]) == 2
    assert junk_lines[0]["query"] == "[mode=garbage] task" and junk_lines[1]["cached"]


async def test_bad_input_gets_422_naming_the_problem(judge):
    async with JudgeClient(judge.url) as client:
        with pytest.raises(ServiceCallError) as empty:
            await client.judge([])
    assert empty.value.status == 422 and "empty" in empty.value.message

    step = {"action": "look"}
    body = ('{"trajectories": [{"trajectory_id": "ok", "steps": [{"action": "a"}], "outcome": 1},'
            '{"trajectory_id": "nosteps", "steps": [], "outcome": 1},'
            '{"trajectory_id": "nan", "steps": [' + json.dumps(step) + '], "outcome": NaN}]}')
    response = httpx.post(f"{judge.url}/v1/judge", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    error = response.json()["error"]  # NaN is not JSON: the service base refuses it before the route runs
    assert error["details"] == [{"field": "body.trajectories.2.outcome", "type": "json_value",
                                 "message": "nan is not a JSON number; send a finite number"}]
    no_nan = body.replace("NaN", "0.5")
    response = httpx.post(f"{judge.url}/v1/judge", content=no_nan, headers={"content-type": "application/json"})
    assert response.status_code == 422
    error = response.json()["error"]
    assert "trajectories[1] (id 'nosteps') has no steps" in error["message"]
    assert {d["field"] for d in error["details"]} == {"steps"}

    response = httpx.post(f"{judge.url}/v1/judge", json={"trajectories": [{"trajectory_id": "x", "steps": []}]})
    assert response.status_code == 422 and "outcome" in response.json()["error"]["message"]


def test_cli_flags_and_missing_llm_config(fake_llm, tmp_path):
    # No judge LLM configured: the service refuses to start and says what to set.
    done = subprocess.run([sys.executable, "-m", "judge", "--port", str(free_port())], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "judge.llm is not set" in done.stderr

    url, _ = fake_llm
    audit = tmp_path / "flags-audit.jsonl"
    with run_service("judge", ["--llm-base-url", url, "--llm-model", "fake-judge",
                                         "--audit-log", str(audit)]) as service:
        body = {"trajectories": [{"trajectory_id": "f", "query": "flags task", "outcome": 1,
                                  "steps": [{"action": "useful step"}]}]}
        response = httpx.post(f"{service.url}/v1/judge", json=body, timeout=30)
    assert response.status_code == 200
    assert response.json()["judgments"][0]["labels"][0]["label"] == "GOOD"
    assert json.loads(audit.read_text().splitlines()[0])["trajectory_id"] == "f"
