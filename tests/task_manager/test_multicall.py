"""Multi-call synthesis: flights' tier-2 and tier-3 kinds (book the cheapest flight for a passenger id or name,
cancel a booking, rebook) written in the environment's own forms, from observed calls, over real HTTP.

A scripted exploration of a rebook train task (the calls a careful agent makes, stepped in a real instance)
gives one verified task of every kind, each worded as the environment's own train tasks are (the profile's
classifier reads it as that kind), each keeping its reference calls; a planted reference that books another
flight than the one observed is rejected. Then the task manager service with the random explorer and
`lookup_kinds: train`: the funnel per kind with plain counts by reason, and the warm start's references.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
import yaml

from engine.models import load_tokenizer
from env_service.client import EnvClient
from env_service.environments.flights import FlightsEnvironment
from task_manager.client import TaskClient
from task_manager.envs import EnvAccess
from task_manager.explore import ExploreConfig, ExplorerView, explore_episode
from task_manager.kinds import classify, proposal_kind
from task_manager.models import Call, Exploration
from task_manager.multicall import CLOSING_REPLY, MultiCallSynthesizer, fill_slots, observed_calls
from task_manager.profile import load_profile_file
from task_manager.service import BUILTIN_PROFILES
from task_manager.verify import verify
from tests.helpers import ServiceProcess, run_service
from tests.task_manager.conftest import write_conf
from trainer.settings import RolloutConfig
from trainer.warm_start import from_trajectory, render

PROFILE = load_profile_file(BUILTIN_PROFILES / "flights.json")
FLIGHTS = {"version": 2, "tiers": [2, 3], "splits": {"train": 16, "validation": 8, "test": 8}}
TIER_2_3 = {"book_by_id", "cancel_by_id", "book_cheapest", "cancel", "rebook"}


def test_slots_name_changes_and_records_through_filters():
    values = {"flight.flight_id": "UA2169-0602", "flight.date": "2025-06-02", "flight.origin": "DEN"}
    assert fill_slots("flight {flight.flight_id|number} from {flight.origin|place} on {flight.date|day}", values,
                      PROFILE) == "flight UA2169 from Denver (DEN) on June 2, 2025"
    assert fill_slots("{flight.origin|place}", {"flight.origin": "XXX"}, PROFILE) is None  # not in the glossary
    assert fill_slots("{passenger.name}", values, PROFILE) is None
    with pytest.raises(ValueError, match="unknown slot filter 'nope'.*day"):
        fill_slots("{flight.date|nope}", values, PROFILE)


@pytest.fixture(scope="module")
def tier_2_3_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    conf = tmp_path_factory.mktemp("env23") / "env.yaml"
    conf.write_text(yaml.safe_dump({"env_service": {"environments": {"flights": FLIGHTS}}}))
    with run_service("env_service", ["--conf", str(conf)]) as service:
        yield service


class RebookScript:
    """Explores a rebook task as a careful agent solves it: the held flight's route searched first, then the
    environment's reference calls, the order to cancel taken from what list_orders returned."""

    name = "scripted"

    def __init__(self, calls: list[Call]) -> None:
        self.calls = calls

    async def act(self, view: ExplorerView) -> tuple[str, list[Call]]:
        call = self.calls[len(view.steps)]
        if call.name == "cancel_order":
            listed = next(json.loads(s.observation) for s in view.steps if s.calls[0].name == "list_orders")
            call = Call(name="cancel_order", arguments={"order_id": listed[0]["order_id"]})
        return call.render(), [call]


async def _rebook_exploration(access: EnvAccess) -> Exploration:
    flights = FlightsEnvironment(FLIGHTS)
    seed = next(t for t in flights.task_ids("train") if flights.task(t).kind == "rebook")
    task = flights.task(seed)
    held = flights.world_of(task).flights[task.preload[0][1]]
    calls = [Call(name="search_flight", arguments={"origin": held.origin, "destination": held.destination,
                                                   "date": held.date})]
    calls += [Call(name=name, arguments=arguments) for name, arguments in task.reference]
    return await explore_episode(access, RebookScript(calls), PROFILE, "flights", seed,
                                 ExploreConfig(breadth_steps=len(calls), depth_steps=0))


def test_every_tier_2_and_3_kind_is_verified_in_the_environments_forms_and_a_planted_reference_is_not(
        tier_2_3_env: ServiceProcess):
    async def run() -> None:
        async with EnvClient(tier_2_3_env.url) as client:
            access = EnvAccess(client)
            exploration = await _rebook_exploration(access)
            assert not any(s.failed for s in exploration.steps)
            synthesizer = MultiCallSynthesizer(access, PROFILE)
            proposals, turned_down = await synthesizer.propose(
                observed_calls(exploration), env_type="flights", seed_task_id=exploration.seed_task_id,
                initial_state=exploration.initial_state)
            assert not turned_down
            verified = {}
            for proposal in proposals:
                reference, reason = await verify(access, proposal)
                assert reason == "ok", (proposal.task, proposal.query)
                assert reference is not None and reference.calls == proposal.calls  # the call sequence is kept
                assert reference.actions[-1] == CLOSING_REPLY and reference.end_state == proposal.goal_state
                # Worded as the environment's own tasks of that kind are: the train queries' classifier agrees.
                assert classify(PROFILE, proposal.query) == (proposal.task, proposal.query_form)
                verified[proposal.task] = proposal
            assert set(verified) == TIER_2_3
            assert [c.name for c in verified["rebook"].calls] == ["get_passenger", "list_orders", "search_flight",
                                                                   "cancel_order", "book_ticket"]
            assert proposal_kind(verified["cancel_by_id"]) == \
                "cancel_by_id:list_orders(passenger_id) > cancel_order(order_id):ids"

            # Planted: the same query and expected state, but the reference books another flight of the route.
            good = verified["book_by_id"]
            search = json.loads(next(s.observation for s in exploration.steps
                                     if s.calls[0].name == "search_flight" and s.calls[0].arguments ==
                                     good.calls[0].arguments))
            booked = good.calls[1].arguments["flight_id"]
            other = next(f["flight_id"] for f in search if f["flight_id"] != booked and f["seats_left"] > 0)
            planted_calls = [good.calls[0], Call(name="book_ticket", arguments={**good.calls[1].arguments,
                                                                                "flight_id": other})]
            planted = good.model_copy(update={"calls": planted_calls,
                                              "actions": [c.render() for c in planted_calls] + [CLOSING_REPLY]})
            assert await verify(access, planted) == (None, "goal_not_reached")
            # And a query whose selection the reference's own search does not make (another flight the cheapest).
            assert [t.answer for t in good.selections] == [booked]
            moved = good.model_copy(update={"selections": [good.selections[0].model_copy(update={"answer": other})]})
            assert await verify(access, moved) == (None, "selection_changed")

    asyncio.run(run())


def test_a_booking_of_another_flight_of_a_search_becomes_the_task_of_booking_its_cheapest(
        tier_2_3_env: ServiceProcess):
    flights = FlightsEnvironment(FLIGHTS)
    seed = next(t for t in flights.task_ids("train") if flights.task(t).kind == "book_by_id")
    task = flights.task(seed)
    search, book = (Call(name=name, arguments=arguments) for name, arguments in task.reference)
    world = flights.world_of(task)
    cheapest = book.arguments["flight_id"]
    route = [f for f in world.route_flights(*(search.arguments[k] for k in ("origin", "destination", "date")))
             if f.seats > 0 and f.flight_id != cheapest and f.price <= world.passengers[task.passenger_id].balance]
    observed_booking = Call(name="book_ticket", arguments={**book.arguments, "flight_id": route[0].flight_id})

    async def run() -> None:
        async with EnvClient(tier_2_3_env.url) as client:
            access = EnvAccess(client)
            exploration = await explore_episode(access, RebookScript([search, observed_booking]), PROFILE, "flights",
                                                seed, ExploreConfig(breadth_steps=2, depth_steps=0))
            assert [s.state_changed for s in exploration.steps] == [False, True]
            proposals, _ = await MultiCallSynthesizer(access, PROFILE, ("ids",)).propose(
                observed_calls(exploration), env_type="flights", seed_task_id=seed,
                initial_state=exploration.initial_state)
            (proposal,) = [p for p in proposals if p.task == "book_by_id"]
            assert proposal.query == task.query and proposal.calls == [search, book]  # the cheapest, as the env's
            reference, reason = await verify(access, proposal)
            assert reason == "ok" and reference is not None
            assert [o["flight_id"] for o in reference.end_state["orders"]] == [cheapest]

    asyncio.run(run())


def test_the_service_reports_the_multicall_funnel_per_kind_and_serves_its_references(
        tier_2_3_env: ServiceProcess, tmp_path):
    conf = write_conf(tmp_path / "tm.yaml", tier_2_3_env.url, tmp_path / "store", serve_training_references=True,
                      dedup={"embeddings": False}, explore={"explorer": "random", "breadth_steps": 6, "depth_steps": 10},
                      synthesis={"synthesizer": "hindsight", "kinds": ["multicall"], "query_forms": ["ids", "names"],
                                 "lookup_kinds": "train"},
                      mixture={"synthetic_ratio": 1.0, "use_original": False})

    async def run() -> None:
        with run_service("task_manager", ["--conf", str(conf)]) as service:
            async with TaskClient(service.url) as tasks:
                job = await tasks.wait_job((await tasks.submit_job("flights", episodes=8, seed=0)).job_id, timeout=120)
                assert job.status == "done", job.error
                # The train split asks every tier-2/3 kind but book_constrained, which the profile does not write.
                assert {k.split("/")[0] for k in job.progress["asked_kinds"]} == TIER_2_3
                funnel = (await tasks.stats())["funnel_by_kind"]
                assert funnel and all(kind.split(":")[0] in TIER_2_3 for kind in funnel)
                for kind, row in funnel.items():
                    reasons = sum(row.get("rejected", {}).values())
                    assert row["proposed"] == row["verified"] + reasons, kind  # every proposal is accounted for
                    assert all(isinstance(n, int) for stage in ("rejected", "dropped", "unmatched")
                               for n in row.get(stage, {}).values())
                kept = sum(row["kept"] for row in funnel.values())
                assert kept >= 1
                served = await tasks.training_references("flights", limit=100)
                assert served.replayed == kept
                # A limited warm start gets one task of each kind in turn, not the kind explored most.
                kinds = {kind for kind, row in funnel.items() if row["trainable"]}
                assert len(kinds) >= 2, funnel
                few = await tasks.training_references("flights", limit=len(kinds))
                assert sorted(t.metadata["task_kind"] for t in few.trajectories) == sorted(kinds)
                for trajectory in served.trajectories:
                    assert trajectory.steps[-1].action.text() == CLOSING_REPLY and trajectory.steps[-1].observation is None
                    assert all("<tool_call>" in s.action.text() for s in trajectory.steps[:-1])
                    assert trajectory.metadata["task_kind"].split(":")[0] in TIER_2_3
                # The warm start trains on them as the agent's own turns: every call and the closing reply, and
                # nothing else, under the loss mask.
                tokenizer = load_tokenizer("tiny")
                solved = from_trajectory(served.trajectories[0])
                segments = render(solved, tokenizer, RolloutConfig(env="flights", template="linear", max_context=4096))
                trained = [tokenizer.decode([t for t, m in zip(s.response_ids, s.loss_mask, strict=True) if m])
                           for s in segments]
                assert sum(m for s in segments for m in s.loss_mask) == sum(
                    len(tokenizer.encode(action, add_special_tokens=False)) + 1 for action, _ in solved.steps)
                assert CLOSING_REPLY in trained[-1] and "cancel_order" in "".join(trained)

    asyncio.run(run())
