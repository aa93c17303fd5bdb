"""Tiers of flights tasks: counts per split and tier, stable ids, and tier-1 answers graded over real HTTP."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml

from env_service.client import EnvClient
from env_service.environments.flights import FlightsEnvironment
from env_service.environments.flights.answers import amounts, answer_alone, answer_correct
from env_service.environments.flights.tasks import TIER_KINDS
from tests.helpers import run_env_service

TIERS = {"tiers": {1: 2, 2: 1, 3: 1}, "splits": {"train": 40, "validation": 20, "test": 10}}


def test_answers_are_normalized_and_a_competing_value_fails():
    assert amounts("It costs $1,200.00 (UA123-0603, June 3, 2025 at 14:05).") == {"1200"}
    assert answer_correct("The cheapest fare is $412.", "412", ("388", "450"))
    assert answer_correct("412 USD", "412", ("388",))
    assert not answer_correct("Fares: 412, 388 and 450.", "412", ("388", "450"))  # pasting the search result
    assert not answer_correct("It is 413 dollars.", "412", ("388",))
    assert answer_correct("Alice's passenger id is p1003.", "P1003", ("P1004",))
    assert answer_correct("ID: P-1003", "P1003", ())
    assert not answer_correct("P1003 or P1004", "P1003", ("P1004",))


def test_a_hedge_passes_the_environments_grader_but_not_the_single_value_one():
    hedge = "Hiro Wang has 2, that is 2, 2,500, 2,500."  # an ablation reply; no passenger has 2 USD of credit
    assert answer_correct(hedge, "2500", ("900", "1200"))
    assert not answer_alone(hedge, "2500")
    assert answer_alone("Hiro Wang has $2,500.00 of travel credit (June 3, 14:05).", "2500")
    assert answer_alone("Alice's passenger id is p1003.", "P1003")
    assert not answer_alone("P1003, not P1004", "P1003")
    assert answer_alone("Take ua123-0603.", "UA123-0603") and not answer_alone("UA123-0603 or UA9-0603", "UA123-0603")


def test_tier_counts_are_shared_out_and_ids_are_stable():
    env = FlightsEnvironment(TIERS)
    assert env.tier_counts == {"train": {1: 20, 2: 10, 3: 10}, "validation": {1: 10, 2: 5, 3: 5},
                               "test": {1: 5, 2: 3, 3: 2}}
    ids = env.task_ids("validation")
    assert len(ids) == 20 and len(set(ids)) == 20
    assert {i.split("-")[1] for i in ids[:4]} == {"t1", "t2", "t3"}, "the first ids already mix the tiers"
    again = FlightsEnvironment({**TIERS, "tiers": [1, 2, 3]})  # another mix: the shared ids keep their task
    assert all(env.task(i).query == again.task(i).query for i in ids if i in set(again.task_ids("validation")))
    for task_id in ids:
        task = env.task(task_id)
        assert task.tier == int(task_id.split("-")[1][1:]) and task.kind in TIER_KINDS[task.tier]
        assert len(task.reference) == {1: 1, 2: 2}.get(task.tier, len(task.reference))
        assert (task.answer is not None) == (task.tier == 1)
    # tier 3 with the tier in its id is the original task renamed; without `tiers` ids are unchanged
    plain = FlightsEnvironment({"splits": TIERS["splits"]})
    assert plain.task_ids("validation")[:2] == ["validation-0000", "validation-0001"]
    assert plain.task("validation-0003").query == env.task("validation-t3-0003").query
    with pytest.raises(KeyError, match="train-t1-0000"):
        env.task("validation-0003")
    with pytest.raises(ValueError, match="unknown tier 4"):
        FlightsEnvironment({"tiers": [1, 4]})


def _call(name: str, arguments: dict) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def test_tiers_over_http_counts_and_tier1_grading(tmp_path):
    env = FlightsEnvironment(TIERS)
    with run_env_service(yaml.safe_dump({"env_service": {"environments": {"flights": TIERS}}}), tmp_path) as svc:

        async def scenario() -> None:
            async with EnvClient(svc.url) as client:
                for split, size in TIERS["splits"].items():
                    ids = await client.task_ids("flights", split)
                    assert ids == env.task_ids(split) and len(ids) == size
                info = await client.describe("flights")
                assert info["info"]["tiers"]["validation"] == {"1": 10, "2": 5, "3": 5}

                fare = next(i for i in env.task_ids("validation") if env.task(i).kind == "fare_lookup")
                task = env.task(fare)

                async def episode(replies: list[str]) -> tuple[float, dict]:
                    created = await client.create("flights", fare)
                    try:
                        for reply in replies:
                            result = await client.step(created.instance_id, reply)
                        evaluated = await client.evaluate(created.instance_id)
                        assert result.done and result.reward == evaluated.score
                        return evaluated.score, evaluated.info
                    finally:
                        await client.release(created.instance_id)

                search = _call(*task.reference[0])
                score, info = await episode([search, f"The cheapest fare is ${task.answer}.00 USD."])
                assert score == 1.0 and info["tier"] == 1 and info["answer_correct"] is True
                assert (await episode([f"{task.answer}"]))[0] == 1.0, "a right answer needs no particular path"
                wrong = task.wrong_answers[0]
                assert (await episode([search, f"It is {wrong} USD."]))[0] == 0.0
                assert (await episode([search, f"Fares: {task.answer}, {wrong}."]))[0] == 0.0
                # Booking a seat is not answering a question: the state must stay as it was.
                rich = max(env.world.passengers.values(), key=lambda p: p.balance).passenger_id
                book = _call("book_ticket", {"passenger_id": rich, "flight_id": task.target_flight})
                assert (await episode([search, book, f"{task.answer} USD"]))[0] == 0.0

                credit = next(i for i in env.task_ids("validation") if env.task(i).kind == "credit_lookup")
                created = await client.create("flights", credit)
                try:
                    await client.step(created.instance_id, _call(*env.task(credit).reference[0]))
                    result = await client.step(created.instance_id, f"{env.task(credit).answer} dollars")
                    assert result.done and result.reward == 1.0
                finally:
                    await client.release(created.instance_id)

        asyncio.run(scenario())


def test_prompt_example_is_opt_in_and_names_no_real_passenger():
    plain, example = FlightsEnvironment({}), FlightsEnvironment({"prompt_example": True})
    assert "Example:" not in plain.system_prompt and example.system_prompt.startswith(plain.system_prompt)
    assert "Zoe Park" in example.system_prompt
    assert all(p.name != "Zoe Park" for p in example.world.passengers.values())
