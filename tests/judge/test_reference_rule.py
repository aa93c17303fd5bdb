"""The reference rule labeller on hand-built trajectories (flights tier-1 style: one lookup call, then a reply),
and the judge settings and fallback around it (the whole path over HTTP: tests/task_manager/test_leak_canary.py)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from judge.core import Judge
from judge.reference_rule import Reference, call_key, label_steps, step_calls
from judge.references import ReferenceSource
from judge.schemas import JudgeStep, JudgeTrajectory
from judge.settings import JudgeSettings
from tests.helpers import free_port

LOOKUP = call_key("get_passenger", {"name": "Rosa Wang"})
CREDIT = Reference(calls=(LOOKUP,), answer="2500")
FOUND = json.dumps({"passenger_id": "P1003", "name": "Rosa Wang", "travel_credit": 2500})
NOT_FOUND = "Error: no passenger named 'Rosa Wong'"


def labels(*steps: tuple[str, str | None], reference: Reference = CREDIT) -> list[str]:
    return [lab.label for lab in label_steps([JudgeStep(action=a, observation=o) for a, o in steps], reference)]


def test_correct_episode_is_all_good():
    assert labels(("get_passenger(name='Rosa Wang')", FOUND), ("Rosa Wang has 2,500 USD of credit.", None)) \
        == ["GOOD", "GOOD"]


def test_call_free_guess_is_bad_even_when_right():
    assert labels(("Rosa Wang has 2500 USD.", None)) == ["BAD"]


def test_hedge_is_bad():
    assert labels(("get_passenger(name='Rosa Wang')", FOUND), ("She has 2,400, not 2,500.", None)) == ["GOOD", "BAD"]


def test_wrong_argument_call_and_the_guess_after_it():
    # the value never appeared in an observation, so even the right number is a guess
    assert labels(("get_passenger(name='Rosa Wong')", NOT_FOUND), ("2500 USD", None)) == ["BAD", "BAD"]


def test_right_call_wrong_reply():
    assert labels(("get_passenger(name='Rosa Wang')", FOUND), ("Rosa Wang has 1200 USD.", None)) == ["GOOD", "BAD"]


def test_repeat_of_a_reference_call_is_bad():
    assert labels(("get_passenger(name='Rosa Wang')", FOUND), ("get_passenger(name='Rosa Wang')", FOUND),
                  ("2500", None)) == ["GOOD", "BAD", "GOOD"]


def test_empty_and_unparseable_steps_are_bad():
    assert labels(("", None), ("   ", None), ("get_passenger(name='Rosa", "parse error")) == ["BAD", "BAD", "BAD"]


def test_every_call_format_an_agent_uses():
    tool_call = '<tool_call>{"name": "get_passenger", "arguments": {"name": "Rosa Wang"}}</tool_call>'
    rendered = 'Looking her up.\n[tool call] get_passenger({"name": "Rosa Wang"})'  # judge.client.render_action
    for action in (tool_call, rendered, "```\nget_passenger(name=\"Rosa Wang\")\n```"):
        assert step_calls(action) == [LOOKUP], action
    assert step_calls('[tool call] get_passenger({"name": ') is None
    assert step_calls('[tool call] get_passenger({"name": })') is None
    assert step_calls("She has 2500.") == []


def test_arguments_compare_as_values():
    assert call_key("search_flight", {"date": "2025-06-03", "max_price": 412.0}) == \
        call_key("search_flight", {"max_price": 412, "date": "2025-06-03"})


def test_fare_answer_among_other_fares_in_the_observation():
    search = call_key("search_flight", {"origin": "SFO", "destination": "JFK", "date": "2025-06-03"})
    fare = Reference(calls=(search,), answer="412")
    result = json.dumps([{"flight_id": "UA101-0603", "price": 412, "seats": 3},
                         {"flight_id": "DL202-0603", "price": 530, "seats": 1}])
    call = "search_flight(origin='SFO', destination='JFK', date='2025-06-03')"
    assert labels((call, result), ("The cheapest fare is $412.", None), reference=fare) == ["GOOD", "GOOD"]
    # pasting the search result states every fare: not the answer alone
    assert labels((call, result), ("412 or 530", None), reference=fare) == ["GOOD", "BAD"]
    # a call not in the reference: another route
    assert labels(("search_flight(origin='JFK', destination='SFO', date='2025-06-03')", "[]"),
                  reference=fare) == ["BAD"]


@pytest.mark.parametrize(("steps", "want"), [
    ([("search_flight(origin='SFO', destination='JFK')", "[...]"), ("book_ticket(passenger_id='P1', flight_id='F1')",
                                                                     "ok"), ("Booked.", None)], ["GOOD", "GOOD", "GOOD"]),
    ([("search_flight(origin='SFO', destination='JFK')", "[...]"), ("Booked.", None)], ["GOOD", "BAD"]),
])
def test_state_change_task_closes_after_every_reference_call(steps, want):
    booking = Reference(calls=(call_key("search_flight", {"origin": "SFO", "destination": "JFK"}),
                               call_key("book_ticket", {"passenger_id": "P1", "flight_id": "F1"})))
    assert labels(*steps, reference=booking) == want


def test_reasons_never_quote_the_reference():
    secret = Reference(calls=(call_key("get_passenger", {"name": "SECRET-NAME"}),), answer="SECRET-ANSWER-9")
    steps = [JudgeStep(action="get_passenger(name='x')", observation="none"), JudgeStep(action="I do not know.")]
    for label in label_steps(steps, secret):
        assert "SECRET" not in label.reason and label.reason.startswith("rule: ")


def test_settings_name_what_references_need():
    with pytest.raises(ValidationError, match="task_manager_url"):
        JudgeSettings(labeller="reference_rule")
    with pytest.raises(ValidationError, match="task_manager_url"):
        JudgeSettings(llm={"base_url": "http://127.0.0.1:1/v1", "model": "m"}, reference=True)
    with pytest.raises(ValidationError, match="choose one"):
        JudgeSettings(labeller="reference_rule", reference=True, task_manager_url="http://127.0.0.1:1")


async def test_without_a_reference_or_an_llm_the_outcome_labels_it():
    """The task manager is down (a closed port) and no LLM is configured: flagged outcome-sign labels."""
    settings = JudgeSettings(labeller="reference_rule", task_manager_url=f"http://127.0.0.1:{free_port()}",
                             audit_log=None)
    judge = Judge(settings, None, references=ReferenceSource(settings.task_manager_url))
    try:
        item = JudgeTrajectory(trajectory_id="t", task_id="syn-1", outcome=1.0,
                               steps=[JudgeStep(action="get_passenger(name='Rosa Wang')", observation=FOUND)])
        response = await judge.judge_batch([item])
    finally:
        await judge.aclose()
    (judgment,) = response.judgments
    assert (judgment.source, judgment.fallback, [lab.label for lab in judgment.labels]) == ("outcome", True, ["GOOD"])
    stats = judge.stats()
    assert stats.reference_lookup_failures == 1 and stats.labels_by_source == {"outcome": 1}
