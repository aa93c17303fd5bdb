"""The LLM synthesizer's schema grounded in a real exploration of `flights` over HTTP: it compiles in
llm_server's grammar engine, admits the values the exploration observed and nothing made up, and a
proposal written from allowed values replays and verifies. The model writing through it is the tiny
random one: what is checked (only grounded calls come out) does not depend on the model's quality."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import jsonschema
import llguidance
import pytest

from common.llm import LLMClient, LLMRoleConfig
from engine.grammar import json_schema_grammar
from env_service.client import EnvClient
from env_service.environments.flights.desk import tool_docs
from task_manager.envs import EnvAccess
from task_manager.explore import ExploreConfig, RandomExplorer, explore_episode
from task_manager.models import Call, Exploration, Proposal
from task_manager.profile import EnvProfile, call_schema, profile_from_env
from task_manager.synthesize import LLMSynthesizer, grounded_call_schema, task_schema
from task_manager.values import ValuePool, known_values
from task_manager.verify import verify
from tests.helpers import ServiceProcess

Explored = tuple[list[dict[str, Any]], EnvProfile, Exploration]


def _booked(exploration: Exploration) -> bool:
    return any(s.state_changed and not s.failed and s.calls and s.calls[0].name == "book_ticket"
               for s in exploration.steps)


@pytest.fixture(scope="module")
def explored(flights_env: ServiceProcess) -> Explored:
    """The first random exploration (fixed seeds) that booked a ticket: its observations hold flights,
    passengers and an order."""
    async def run() -> Explored:
        async with EnvClient(flights_env.url) as client:
            access = EnvAccess(client)
            tools = await access.tool_docs("flights")
            profile = profile_from_env("flights", await access.profile("flights"), tools)
            seeds = await access.task_ids("flights", "train")
            for episode in range(30):
                exploration = await explore_episode(access, RandomExplorer(random.Random(episode)), profile,
                                                    "flights", seeds[episode % len(seeds)],
                                                    ExploreConfig(breadth_steps=4, depth_steps=8))
                if _booked(exploration):
                    return tools, profile, exploration
        raise AssertionError("no random exploration of 30 booked a ticket")

    return asyncio.run(run())


def _valid(schema: dict[str, Any], call: Call) -> bool:
    try:
        jsonschema.validate(call.model_dump(), schema)
    except jsonschema.ValidationError:
        return False
    return True


def test_grounded_schema_compiles_and_admits_only_observed_values(explored: Explored) -> None:
    tools, _, exploration = explored
    schema = grounded_call_schema(tools, exploration)
    assert schema is not None
    changing = grounded_call_schema(tools, exploration, changing=True)
    assert changing is not None and changing["properties"]["name"]["const"] == "book_ticket"  # the only write seen
    for second in (None, changing):
        grammar = json_schema_grammar(task_schema(tools, call=schema, second=second))
        assert llguidance.LLMatcher.validate_grammar(grammar) == ""
    names = [option["properties"]["name"]["const"] for option in schema["anyOf"]]
    assert set(names) <= {doc["function"]["name"] for doc in tools} and "book_ticket" in names
    # Every call the explorer made successfully can be written again.
    successful = [c for s in exploration.steps if not s.failed for c in s.calls]
    assert successful and all(_valid(schema, c) for c in successful)
    booked = next(c for s in exploration.steps if s.state_changed and not s.failed for c in s.calls
                  if c.name == "book_ticket")
    flights = schema["anyOf"][names.index("book_ticket")]["properties"]["arguments"]["properties"]["flight_id"]["enum"]
    assert booked.arguments["flight_id"] in flights
    # Made-up values, unknown tools and undocumented arguments cannot.
    assert not _valid(schema, Call(name="book_ticket", arguments={**booked.arguments, "passenger_id": "P0000"}))
    assert not _valid(schema, Call(name="book_ticket", arguments={**booked.arguments, "flight_id": "XX000-0000"}))
    assert not _valid(schema, Call(name="book_ticket", arguments={**booked.arguments, "seat": "12A"}))
    assert not _valid(schema, Call(name="refund_everything", arguments={}))
    # A value only a refused call used is not taken as observed.
    refused = {v for s in exploration.steps if s.failed for c in s.calls for v in c.arguments.values()}
    seen = " ".join(s.observation + json.dumps([c.arguments for c in s.calls]) for s in exploration.steps
                    if not s.failed)
    enums = {v for o in schema["anyOf"] for p in o["properties"]["arguments"]["properties"].values() for v in p["enum"]}
    assert not {v for v in refused if str(v) not in seen} & enums

def test_a_proposal_of_allowed_values_replays_and_verifies(flights_env: ServiceProcess, explored: Explored) -> None:
    tools, _, exploration = explored
    schema = grounded_call_schema(tools, exploration)
    assert schema is not None
    book_step = next(s for s in exploration.steps if s.state_changed and not s.failed and s.calls[0].name == "book_ticket")
    booking = book_step.calls[0]
    flight = next(f for s in exploration.steps[: book_step.index] if not s.failed and s.calls
                  and s.calls[0].name == "search_flight"
                  for f in json.loads(s.observation) if f["flight_id"] == booking.arguments["flight_id"])
    search = Call(name="search_flight", arguments={"origin": flight["origin"], "destination": flight["destination"],
                                                   "date": flight["date"]})
    assert _valid(schema, search) and _valid(schema, booking)
    proposal = Proposal(query=f"Book flight {flight['flight_id']} for passenger {booking.arguments['passenger_id']}.",
                        actions=[search.render(), booking.render()], recorded_initial_state=exploration.initial_state,
                        synthesizer="llm", env_type="flights", seed_task_id=exploration.seed_task_id)

    async def run() -> tuple[Any, str]:
        async with EnvClient(flights_env.url) as client:
            return await verify(EnvAccess(client), proposal)

    reference, reason = asyncio.run(run())
    assert reason == "ok" and reference is not None
    assert booking.arguments["flight_id"] in json.dumps(reference.end_state)  # the booking is in the verified state


def test_llm_synthesizer_writes_only_grounded_calls(tiny_server: ServiceProcess, explored: Explored) -> None:
    tools, profile, exploration = explored
    # Two successful steps: the prompt must fit the tiny model's context of 2048 tokens.
    short = exploration.model_copy(update={"steps": [s for s in exploration.steps if not s.failed][:2]})
    short_schema = grounded_call_schema(tools, short)
    assert short_schema is not None

    async def run() -> tuple[list[Proposal], Any]:
        llm = LLMClient("synthesizer", LLMRoleConfig(base_url=f"{tiny_server.url}/v1", model="tiny", timeout=300,
                                                     max_retries=0))
        synthesizer = LLMSynthesizer(llm, profile, max_tokens=256, temperature=0.0)
        return await synthesizer.propose(short, [], tools)

    proposals, stats = asyncio.run(run())
    assert stats.parsed >= 1 and len(proposals) == stats.parsed  # the grammar made even a random model write tasks
    calls = [json.loads(a.removeprefix("<tool_call>").removesuffix("</tool_call>"))
             for p in proposals for a in p.actions]
    assert all(_valid(short_schema, Call.model_validate(c)) for c in calls)


def test_explorer_schema_draws_argument_values_from_what_it_met() -> None:
    pool = ValuePool()
    pool.harvest_request("Book the 2025-06-03 flight from SFO to BOS for Alice Wang.")
    pool.harvest(json.dumps({"passenger_id": "P1004", "name": "Alice Wang"}), 0)
    schema = call_schema(tool_docs(), lambda argument, s: known_values(pool, argument, s))
    by_name = {o["properties"]["name"]["const"]: o["properties"]["arguments"] for o in schema["anyOf"]}
    search = by_name["search_flight"]["properties"]
    assert set(search["origin"]["enum"]) == {"SFO", "BOS"} and search["date"]["enum"] == ["2025-06-03"]
    assert by_name["book_ticket"]["properties"]["passenger_id"]["enum"] == ["P1004"]
    # Nothing known for a flight id yet: the documented string, bounded so that the call ends within the budget.
    flight_id = by_name["book_ticket"]["properties"]["flight_id"]
    assert "enum" not in flight_id and flight_id["type"] == "string" and flight_id["maxLength"] == 60
    assert all(args["additionalProperties"] is False for args in by_name.values())
    assert llguidance.LLMatcher.validate_grammar(json_schema_grammar(schema)) == ""
