"""Lookup synthesis: tier-1-style questions answered in text, from what an exploration read.

Units on a recorded exploration (hand-computed answers), then the real path over HTTP: env service,
task manager and experience manager; a synthesize job with `kinds: [goal, lookup]` in both query forms,
the answers checked against the flights world itself, grading of real replayed episodes, and pool
seeding with lookup demonstrations (held-out tasks still refused).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from common.answers import answer_alone, answer_correct
from common.http import ServiceCallError
from common.schemas import ChatMessage, Step, Task, Trajectory
from env_service.client import EnvClient
from env_service.environments.flights import FlightsEnvironment
from env_service.environments.flights.tasks import _cheapest
from experience_manager.client import ExperienceClient
from task_manager.client import TaskClient
from task_manager.envs import comparable_state
from task_manager.grading import GradingError
from task_manager.lookups import LookupSynthesizer, closing_reply, fill, final_reply, grade_answer
from task_manager.models import Call, Exploration, ExploreStep, Reference, StoredTask
from task_manager.profile import load_profile_file
from task_manager.service import BUILTIN_PROFILES
from tests.experience_manager.conftest import write_conf as write_em_conf
from tests.helpers import free_port, run_service
from tests.task_manager.conftest import stored_rows, write_conf

PROFILE = load_profile_file(BUILTIN_PROFILES / "flights.json")

FLIGHTS = [  # a search's records as flights returns them (prices and seats made up for hand-computed answers)
    {"flight_id": "UA100-0603", "airline": "United", "origin": "SFO", "destination": "JFK", "date": "2025-06-03",
     "depart": "08:05", "arrive": "16:30", "duration_min": 325, "stops": 0, "price": 180, "seats_left": 0},
    {"flight_id": "DL200-0603", "airline": "Delta", "origin": "SFO", "destination": "JFK", "date": "2025-06-03",
     "depart": "11:40", "arrive": "20:10", "duration_min": 330, "stops": 0, "price": 245, "seats_left": 3},
    {"flight_id": "AA300-0603", "airline": "American", "origin": "SFO", "destination": "JFK", "date": "2025-06-03",
     "depart": "14:15", "arrive": "23:50", "duration_min": 395, "stops": 1, "price": 212, "seats_left": 7},
]


def _step(index: int, name: str, arguments: dict, observation: object) -> ExploreStep:
    call = Call(name=name, arguments=arguments)
    return ExploreStep(index=index, phase="breadth", action=call.render(), calls=[call],
                       observation=json.dumps(observation))


def _recorded() -> Exploration:
    return Exploration(env_type="flights", seed_task_id="train-0003", explorer="random", initial_state={}, steps=[
        _step(0, "get_passenger", {"passenger_id": "P1003"},
              {"passenger_id": "P1003", "name": "Chen Smith", "tier": "gold", "travel_credit": 1200}),
        _step(1, "search_flight", {"origin": "SFO", "destination": "JFK", "date": "2025-06-03"}, FLIGHTS),
        _step(2, "get_passenger", {"name": "Dana Okafor"},
              {"passenger_id": "P1004", "name": "Dana Okafor", "tier": "basic", "travel_credit": 400}),
    ])


def test_fill_writes_dates_in_words_and_places_from_the_glossary():
    record = {"origin": "SFO", "date": "2025-06-03"}
    assert fill("{origin|place} on {date|day}", record, {}, PROFILE.glossary) == "San Francisco (SFO) on June 3, 2025"
    assert fill("{origin|place}", {"origin": "XXX"}, {}, PROFILE.glossary) is None  # not in the glossary
    assert fill("{missing}", record, {}, PROFILE.glossary) is None
    assert fill("from {origin}", {}, {"origin": "BOS"}, PROFILE.glossary) == "from BOS"  # the call's argument


def test_the_answer_grader_reads_flight_ids_too():
    assert answer_correct("The cheapest is ua200-0603.", "UA200-0603", ("AA300-0603",))
    assert not answer_correct("DL200-0603 or AA300-0603", "DL200-0603", ("AA300-0603",))
    assert answer_correct("It costs $1,200.00", "1200", ("400",)) and not answer_correct("P1003", "1200")


def test_lookups_from_a_recorded_exploration_have_hand_computed_answers():
    proposals, stats = LookupSynthesizer(PROFILE, ("ids", "names"), max_lookups=20).propose(_recorded())
    assert stats.proposed == stats.parsed == len(proposals)
    got = {(p.lookup.kind, p.query_form, p.query): (p.lookup.answer, p.lookup.wrong_answers, p.actions)
           for p in proposals if p.lookup}
    kinds = Counter((kind, form) for kind, form, _ in got)
    # 2 passengers x (credit in 2 forms + id in the names form); the search: the cheapest fare and flight with
    # seats (2 forms each) and 3 flights x (seats and fare, 2 forms each).
    assert kinds == {("credit_lookup", "ids"): 2, ("credit_lookup", "names"): 2, ("id_lookup", "names"): 2,
                     ("fare_lookup", "ids"): 1, ("fare_lookup", "names"): 1, ("flight_lookup", "ids"): 1,
                     ("flight_lookup", "names"): 1, ("seats_lookup", "ids"): 3, ("seats_lookup", "names"): 3,
                     ("flight_fare", "ids"): 3, ("flight_fare", "names"): 3}
    fare = got[("fare_lookup", "names", "What is the cheapest fare with seats left from San Francisco (SFO) to "
                "New York (JFK) on June 3, 2025? Reply with the price in USD.")]
    # UA100 (180) is sold out: the cheapest with seats is AA300 at 212; the route's other fares are wrong.
    assert fare[0] == "212" and fare[1] == ["180", "245"]
    assert fare[2] == ['<tool_call>{"name": "search_flight", "arguments": {"origin": "SFO", "destination": "JFK", '
                       '"date": "2025-06-03"}}</tool_call>', "The answer is 212."]
    flight = got[("flight_lookup", "ids", "Which flight from SFO to JFK on 2025-06-03 is the cheapest one with seats "
                  "left? Reply with the flight id.")]
    assert flight[0] == "AA300-0603" and flight[1] == ["DL200-0603", "UA100-0603"]
    credit = got[("credit_lookup", "names", "How much travel credit does Chen Smith have? Reply with the amount in "
                  "USD.")]
    # The names form looks the passenger up by name, though the exploration used the id; the other credit the
    # exploration saw is the wrong answer.
    assert credit[0] == "1200" and credit[1] == ["400"] and '"arguments": {"name": "Chen Smith"}' in credit[2][0]
    seats = got[("seats_lookup", "names", "How many seats are left on the Delta flight departing at 11:40 from San "
                 "Francisco (SFO) to New York (JFK) on June 3, 2025? Reply with the number.")]
    assert seats[0] == "3" and seats[1] == ["0", "7"]
    assert {p.query_form for p in proposals if p.lookup.kind == "id_lookup"} == {"names"}  # ids would give it away
    capped, _ = LookupSynthesizer(PROFILE, ("ids", "names"), max_lookups=3).propose(_recorded())
    # At most 3 records asked about, one kind each in order of appearance; each in every form its kind has.
    assert Counter(p.lookup.kind for p in capped) == {"credit_lookup": 2, "id_lookup": 1, "fare_lookup": 2}


def test_a_tie_for_the_cheapest_or_a_refused_call_gives_no_question():
    tie = [dict(FLIGHTS[1]), dict(FLIGHTS[2], price=245)]
    exploration = Exploration(env_type="flights", seed_task_id="train-0001", explorer="random", initial_state={},
                              steps=[_step(0, "search_flight", {"origin": "SFO", "destination": "JFK"}, tie)])
    proposals, _ = LookupSynthesizer(PROFILE, ("names",)).propose(exploration)
    assert not {"fare_lookup", "flight_lookup"} & {p.lookup.kind for p in proposals}
    exploration.steps[0].failed = True
    assert LookupSynthesizer(PROFILE, ("names",)).propose(exploration)[0] == []


def test_the_answer_is_the_reply_that_ended_the_episode():
    reply = Step(index=1, action=ChatMessage(role="assistant", content="It is 212 USD."),
                 observation=ChatMessage(role="user", content="Thank you, that is all."), done=True)
    call = Step(index=0, action=ChatMessage(role="assistant", content="search_flight(origin='SFO')"),
                observation=ChatMessage(role="tool", content="[]"), done=True)
    assert final_reply(Trajectory(task_id="t", env_type="flights", steps=[call, reply])) == "It is 212 USD."
    assert final_reply(Trajectory(task_id="t", env_type="flights", steps=[call])) is None  # ended on a call
    assert final_reply(Trajectory(task_id="t", env_type="flights", steps=[reply.model_copy(update={"done": False})])) \
        is None


def test_a_lookup_that_changed_the_state_or_sent_no_trajectory_is_not_graded_correct():
    task = Task(task_id="syn-x", env_type="flights", split="train", synthetic=True, seed_task_id="train-0001",
                query="How much travel credit does Chen Smith have?")
    stored = StoredTask(task=task, reference=Reference(actions=["call", "The answer is 1200."], answer="1200",
                                                       wrong_answers=["400"], end_state={"orders": []}))
    reply = Step(index=0, action=ChatMessage(role="assistant", content="Chen Smith has 1,200 USD."),
                 observation=ChatMessage(role="user", content="Thank you, that is all."), done=True)
    trajectory = Trajectory(task_id="syn-x", env_type="flights", steps=[reply])
    same, booked = {"comparable": {"orders": []}}, {"comparable": {"orders": [{"flight_id": "UA1-0603"}]}}
    assert grade_answer(stored, trajectory, same, comparable_state).reward == 1.0
    assert grade_answer(stored, trajectory, None, comparable_state).reward == 1.0  # no state sent: the answer alone
    assert grade_answer(stored, trajectory, booked, comparable_state).reward == 0.0  # a lookup must change nothing
    with pytest.raises(GradingError, match="trajectory"):
        grade_answer(stored, None, same, comparable_state)


def _truth(world: FlightsEnvironment, seed_task: str, kind: str, call: dict, flight_id: str | None) -> str:
    """The answer computed from the flights world itself (and the seed task's preloaded bookings), independently
    of the synthesizer."""
    w = world.world
    desk = world.fresh_desk(world.task(seed_task))
    if kind in ("credit_lookup", "id_lookup"):
        args = call["arguments"]
        passenger = next(p for p in w.passengers.values()
                         if p.passenger_id == args.get("passenger_id") or p.name == args.get("name"))
        return str(passenger.balance if kind == "credit_lookup" else passenger.passenger_id)
    args = call["arguments"]
    flights = w.route_flights(args["origin"], args["destination"], args["date"])
    if kind in ("fare_lookup", "flight_lookup"):
        cheapest = _cheapest(flights, lambda f: desk.seats_left(f.flight_id))
        assert cheapest is not None
        return str(cheapest.price if kind == "fare_lookup" else cheapest.flight_id)
    flight = next(f for f in flights if f.flight_id == flight_id)
    return str(desk.seats_left(flight.flight_id) if kind == "seats_lookup" else flight.price)


async def _episode(env: EnvClient, seed_task: str, query: str, actions: list[str]) -> tuple[Trajectory, dict]:
    """A real episode of the synthetic task (its query) playing `actions`, and its final state."""
    created = await env.create("flights", seed_task, params={"query": query})
    steps = []
    try:
        for i, action in enumerate(actions):
            result = await env.step(created.instance_id, action)
            steps.append(Step(index=i, action=ChatMessage(role="assistant", content=action),
                              observation=result.observation, done=result.done))
        state = (await env.state(created.instance_id)).model_dump(mode="json")
    finally:
        await env.release(created.instance_id)
    return Trajectory(task_id="episode", env_type="flights", messages=created.messages, steps=steps), state


@pytest.mark.slow
def test_lookups_over_http_are_verified_graded_like_the_env_and_seed_the_pool(flights_env, tmp_path):
    em_port = free_port()
    tm_conf = write_conf(tmp_path / "tm.yaml", flights_env.url, tmp_path / "tm", dedup={"embeddings": False},
                         experience_url=f"http://127.0.0.1:{em_port}",
                         synthesis={"kinds": ["goal", "lookup"], "query_forms": ["ids", "names"]})
    em_conf = write_em_conf(tmp_path / "em.yaml", {"summary": {"mode": "heuristic"}})
    world = FlightsEnvironment({})
    with run_service("task_manager", ["--conf", str(tm_conf)]) as tm, \
            run_service("experience_manager", ["--store", str(tmp_path / "em"), "--conf", em_conf], port=em_port) as em:

        async def scenario() -> None:
            async with TaskClient(tm.url) as tasks, EnvClient(flights_env.url) as env, ExperienceClient(em.url) as pool:
                job = await tasks.wait_job((await tasks.submit_job("flights", episodes=3)).job_id, timeout=120)
                assert job.status == "done", job
                synthetic = (await tasks.list_tasks(env="flights", synthetic=True, limit=1000)).tasks
                assert len(synthetic) == job.progress["kept"]
                lookups = [t for t in synthetic if t.metadata.get("kind") == "lookup"]
                forms = Counter(t.metadata["query_form"] for t in lookups)
                kinds = Counter(t.metadata["lookup"] for t in lookups)
                # Both forms, several kinds, and the hindsight goals still made alongside.
                assert forms["ids"] >= 3 and forms["names"] >= 3, forms
                assert len(kinds) >= 4, kinds
                assert any(t.metadata.get("kind") == "goal" for t in synthetic)
                assert all(t.seed_task_id.startswith("train-") for t in synthetic)

                rows = {r["task_id"]: r for r in stored_rows(tmp_path / "tm", "SELECT task_id, reference FROM tasks")}
                for task in lookups:
                    reference = json.loads(rows[task.task_id]["reference"])
                    call = json.loads(reference["actions"][0].removeprefix("<tool_call>").removesuffix("</tool_call>"))
                    flight_id = None
                    if task.metadata["lookup"] in ("seats_lookup", "flight_fare"):  # the flight the query names
                        observed = json.loads(reference["observations"][0])
                        flight_id = next(f["flight_id"] for f in observed if f["flight_id"] in task.query or
                                         (f["airline"] in task.query and f["depart"] in task.query))
                    truth = _truth(world, task.seed_task_id, task.metadata["lookup"], call, flight_id)
                    assert reference["answer"] == truth, task.query
                    assert reference["actions"][-1] == closing_reply(reference["answer"])
                    assert task.metadata.get("answer") is None and reference["answer"] not in json.dumps(task.metadata)

                # Grading: real episodes of the synthetic task, graded over HTTP by the environment's answer grader.
                for task in lookups[:6]:
                    reference = json.loads(rows[task.task_id]["reference"])
                    answer, wrong = reference["answer"], reference["wrong_answers"]
                    call = reference["actions"][0]
                    replies = {f"The answer is {answer}.": 1.0, f"It is {answer}, I think.": 1.0}
                    if wrong:
                        replies[f"The answer is {wrong[0]}."] = 0.0
                        replies[f"Either {answer} or {wrong[0]}."] = 0.0  # pasting competing values is no answer
                    if answer.isdigit():  # a hedge states the answer beside another value of its sort: strict, so 0
                        replies[f"It is {answer}, not {int(answer) + 100}."] = 0.0
                    for reply, expected in replies.items():
                        trajectory, state = await _episode(env, task.seed_task_id, task.query, [call, reply])
                        detail = await tasks.grade_detail(task.task_id, state=state,
                                                          trajectory=trajectory.model_copy(update={"task_id": task.task_id}))
                        assert (detail.reward, detail.method) == (expected, "answer_match"), (task.query, reply)
                        assert expected == float(answer_alone(reply, answer))
                    # An episode that never replied in text (it ended on the call) has not answered.
                    unanswered, state = await _episode(env, task.seed_task_id, task.query, [call])
                    assert await tasks.grade(task.task_id, state=state, trajectory=unanswered) == 0.0
                with pytest.raises(ServiceCallError) as missing:
                    await tasks.grade(lookups[0].task_id, state=state)
                assert (missing.value.status, missing.value.code) == (400, "nothing_to_grade")
                assert "trajectory" in missing.value.message

                # Seeding: the lookups' replayed references reach the pool as demonstrations ending on the reply.
                seeded = await tasks.seed_experience("flights", "lookups", limit=1000)
                assert seeded.replay_failed == 0 and seeded.sent == len(synthetic)
                assert {t.task_id for t in lookups} <= set(seeded.task_ids)
                experiences = await pool.list_experiences("lookups")
                lookup_ids = {t.task_id for t in lookups}
                demos = [e.demonstration for e in experiences if set(e.provenance.task_ids) <= lookup_ids]
                assert demos, "no lookup reached the pool"
                for demo in demos:
                    assert [m.role for m in demo] == ["user", "assistant", "tool", "assistant"], demo
                    assert demo[1].content.startswith("<tool_call>") and demo[2].content.startswith(("{", "["))
                    assert demo[3].content.startswith("The answer is ")
                # The guard still refuses held-out tasks by name, lookups or not.
                for bad in ("validation-0000", "test-0001"):
                    with pytest.raises(ServiceCallError) as refused:
                        await tasks.seed_experience("flights", "lookups", task_ids=[lookups[0].task_id, bad])
                    assert (refused.value.status, refused.value.code) == (400, "not_seedable")
                    assert bad in refused.value.message

        asyncio.run(scenario())
