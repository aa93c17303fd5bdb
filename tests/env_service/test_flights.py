"""The `flights` environment in-process: tasks, preconditions, evaluator, state, action formats."""

from __future__ import annotations

import json

import pytest

from common.actions import ActionParseError, ParsedCall, parse_actions
from common.schemas import ChatMessage, ToolCall, ToolFunction
from env_service.environments.flights import FlightsEnvironment
from env_service.environments.flights.env import resolve_order_refs


@pytest.fixture(scope="module")
def env() -> FlightsEnvironment:
    return FlightsEnvironment()


def say(text: str) -> ChatMessage:
    return ChatMessage(role="assistant", content=text)


def solve(env: FlightsEnvironment, task_id: str, style: str = "python"):
    task = env.task(task_id)
    instance = env.create(task_id)
    instance.reset()
    for name, arguments in task.reference:
        call = ParsedCall(name, resolve_order_refs(instance.desk, arguments))
        if style == "python":
            message = say(call.to_python())
        elif style == "tool_call":
            message = say(f'<tool_call>{json.dumps({"name": call.name, "arguments": call.arguments})}</tool_call>')
        else:
            message = ChatMessage(role="assistant", content="", tool_calls=[
                ToolCall(function=ToolFunction(name=call.name, arguments=json.dumps(call.arguments)))])
        result = instance.step(message)
        assert not result.observation.text().startswith("Error"), result.observation.text()
    return instance


def test_splits_are_deterministic_and_disjoint(env):
    again = FlightsEnvironment()
    ids = {s: env.task_ids(s) for s in ("train", "validation", "test")}
    assert {s: len(v) for s, v in ids.items()} == {"train": 240, "validation": 40, "test": 80}
    assert len(set(sum(ids.values(), []))) == 360
    for task_id in ("train-0000", "validation-0013", "test-0079"):
        assert env.task(task_id) == again.task(task_id)
    assert FlightsEnvironment({"seed": 8}).task("train-0000") != env.task("train-0000")
    kinds = {env.task(t).kind for t in ids["test"][:4]}
    assert kinds == {"book_cheapest", "book_constrained", "cancel", "rebook"}
    with pytest.raises(KeyError):
        env.create("train-0240")
    with pytest.raises(KeyError):
        env.create("train-7")


@pytest.mark.parametrize("style", ["python", "tool_call", "openai"])
def test_reference_solutions_score_one_in_every_action_format(env, style):
    for task_id in env.task_ids("validation")[:12]:
        instance = solve(env, task_id, style)
        assert instance.evaluate().score == 1.0, (task_id, instance.evaluate().info)
        final = instance.step(say("All done."))
        assert final.done and final.reward == 1.0


def test_wrong_actions_score_zero_with_the_difference(env):
    task_id = next(t for t in env.task_ids("train") if env.task(t).kind == "book_cheapest")
    task = env.task(task_id)
    instance = env.create(task_id)
    instance.reset()
    origin, destination, date = task.reference[1][1].values()
    flights = json.loads(instance.step(say(f"search_flight(origin='{origin}', destination='{destination}', "
                                           f"date='{date}')")).observation.content)
    wrong = next(f for f in flights if f["flight_id"] != task.target_flight and f["seats_left"] > 0)
    instance.step(say(f"book_ticket(passenger_id='{task.passenger_id}', flight_id='{wrong['flight_id']}')"))
    result = instance.evaluate()
    assert result.score == 0.0
    assert result.info["unexpected_orders"][0][1] == wrong["flight_id"]
    assert result.info["missing_orders"][0][1] == task.target_flight


def test_hidden_preconditions_explain_themselves(env):
    task = env.task("train-0000")
    instance = env.create("train-0000")
    instance.reset()
    no_search = instance.step(say(f"book_ticket(passenger_id='{task.passenger_id}', flight_id='{task.target_flight}')"))
    assert "search" in no_search.observation.content and "no fare quote" in no_search.observation.content
    flight = env.world.flights[task.target_flight]
    instance.step(say(f"search_flight(origin='{flight.origin}', destination='{flight.destination}')"))
    no_passenger = instance.step(say(f"book_ticket(passenger_id='P9999', flight_id='{task.target_flight}')"))
    assert "does not exist" in no_passenger.observation.content
    booked = instance.step(say(f"book_ticket(passenger_id='{task.passenger_id}', flight_id='{task.target_flight}')"))
    assert "order_id" in booked.observation.content
    assert instance.evaluate().score == 1.0


def test_comparable_state_ignores_generated_ids_and_timestamps(env):
    task_id = next(t for t in env.task_ids("train") if env.task(t).kind == "rebook")
    first, second = solve(env, task_id), solve(env, task_id)
    a, b = first.state(), second.state()
    assert {o["order_id"] for o in a["orders"]} != {o["order_id"] for o in b["orders"]}
    assert a["comparable"] == b["comparable"] and first.state_hash() == second.state_hash()
    assert [o["status"] for o in a["comparable"]["orders"]].count("cancelled") == 1
    fresh = env.create(task_id)
    fresh.reset()
    assert fresh.state_hash() != first.state_hash()


def test_malformed_calls_get_an_observation_not_an_exception(env):
    instance = env.create("train-0001")
    instance.reset()
    for text, expected in [("search_flight(origin='SFO'", "never closed"),
                           ("search_flight('SFO', 'JFK', '2025-06-03', 4)", "takes 3 argument(s)"),
                           ("search_flight('SFO', origin='JFK')", "origin given both by position and by name"),
                           ("<tool_call>{oops}</tool_call>", "not valid JSON"),
                           ("fly_me(to='moon')", "unknown tool"),
                           ("search_flight(origin='SFO')", "missing required argument"),
                           ("search_flight(origin='SFO', destination='XXX')", "unknown airport"),
                           ("cancel_order(order_id=5)", "must be a string")]:
        result = instance.step(say(text))
        assert expected in result.observation.content and not result.done, (text, result.observation.content)


def test_query_replacement_and_step_limit(env):
    instance = env.create("train-0000", {"query": "Find me any flight to Miami.", "max_steps": 2})
    assert instance.reset()[1].content == "Find me any flight to Miami."
    instance.step(say("get_passenger(name='Elif Silva')"))
    last = instance.step(say("list_orders(passenger_id='P1005')"))
    assert last.done and last.info["finished"] == "max_steps"
    assert "replaced" in instance.evaluate().info["note"]
    with pytest.raises(ValueError):
        env.create("train-0000", {"query": ""})


def test_action_parser_formats():
    assert parse_actions(say("[cd(folder='x'), mv(source='a', destination='b')]")) == [
        ParsedCall("cd", {"folder": "x"}), ParsedCall("mv", {"source": "a", "destination": "b"})]
    assert parse_actions(say("Let me look.\nsearch_flight(origin='SFO', destination='JFK')\nThanks")) == [
        ParsedCall("search_flight", {"origin": "SFO", "destination": "JFK"})]
    assert parse_actions(say("```python\nf(a=true, b=null, c=[1, -2.5])\n```")) == [
        ParsedCall("f", {"a": True, "b": None, "c": [1, -2.5]})]
    assert parse_actions(say('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>')) == [
        ParsedCall("f", {"x": 1})]
    assert parse_actions(say('{"name": "g", "arguments": {"y": "z"}}')) == [ParsedCall("g", {"y": "z"})]
    assert parse_actions(say("I have booked the flight (the cheapest one).")) == []
    assert ParsedCall("cd", {"folder": "a b", "n": 2}).to_python() == "cd(folder='a b', n=2)"
    with pytest.raises(ActionParseError, match="arguments are not valid JSON"):
        parse_actions(ChatMessage(role="assistant", tool_calls=[
            ToolCall(function=ToolFunction(name="f", arguments="{bad"))]))
    with pytest.raises(ActionParseError, match="expected a function call"):
        parse_actions(say("[f(a=1), 3]"))


def test_positional_arguments_are_named_from_the_functions_parameters(env):
    names = {"sort": ("file_name",), "mv": ("source", "destination")}.get
    assert parse_actions(say("[sort('final_report.pdf'), mv('a', destination='b')]"), names) == [
        ParsedCall("sort", {"file_name": "final_report.pdf"}), ParsedCall("mv", {"source": "a", "destination": "b"})]
    with pytest.raises(ActionParseError, match="positional arguments need a known function"):
        parse_actions(say("sort('final_report.pdf')"))  # nothing to name them by
    with pytest.raises(ActionParseError, match="need a known function"):
        parse_actions(say("rm('x')"), names)
    # In flights, a positional call does exactly what the keyword call does.
    by_position, by_name = env.create("train-0000"), env.create("train-0000")
    by_position.reset()
    by_name.reset()
    a = by_position.step(say("search_flight('BOS', 'MIA', '2025-06-04')"))
    b = by_name.step(say("search_flight(origin='BOS', destination='MIA', date='2025-06-04')"))
    assert a.observation.content == b.observation.content and a.observation.content.startswith("[{")
