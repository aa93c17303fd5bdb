"""Flights v2: a world per task, disjoint names and dates per split, strict grading; v1 left as it was."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
import yaml

from common.answers import answer_alone
from env_service.client import EnvClient
from env_service.environments.flights import FlightsEnvironment
from env_service.environments.flights.world import AIRPORTS, split_dates, split_name_pool
from tests.helpers import run_env_service

SPLITS = ("train", "validation", "test")
V2 = {"version": 2, "tiers": [1], "splits": {"train": 24, "validation": 12, "test": 12}}


def _call(name: str, arguments: dict) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def test_name_pools_and_dates_of_the_splits_are_disjoint():
    pools = {s: split_name_pool(s) for s in SPLITS}
    for a, b in (("train", "validation"), ("train", "test"), ("validation", "test")):
        assert not set(pools[a][0]) & set(pools[b][0]) and not set(pools[a][1]) & set(pools[b][1])
        assert not set(split_dates(a)) & set(split_dates(b))


def test_every_task_has_its_own_world_drawn_from_its_split():
    env = FlightsEnvironment({"version": 2, "tiers": [1, 2, 3]})
    for split in SPLITS:
        first, last = split_name_pool(split)
        worlds = [env.task(i).world for i in env.task_ids(split)]
        assert len({id(w) for w in worlds}) == len(worlds)
        for world in worlds:
            assert world.dates == split_dates(split)
            assert all(p.name.split()[0] in first and p.name.split()[1] in last for p in world.passengers.values())
    # The same id is the same task and world in another process-wide instance of the environment.
    again = FlightsEnvironment({"version": 2, "tiers": [1, 2, 3]})
    task_id = env.task_ids("test")[5]
    assert again.task(task_id) == env.task(task_id)
    assert again.task(task_id).world.passengers == env.task(task_id).world.passengers


def test_a_guess_is_rarely_right():
    """v1's credits took 4 values (a guess was right one time in four); v2's take hundreds."""
    env = FlightsEnvironment({"version": 2, "tiers": [1]})
    tasks = [env.task(i) for s in SPLITS for i in env.task_ids(s)]
    by_kind: dict[str, Counter] = {}
    for task in tasks:
        by_kind.setdefault(task.kind, Counter())[task.answer] += 1
    for kind, answers in by_kind.items():
        # The best constant guess for a kind (its most common answer) is right for well under 5% of its tasks.
        assert answers.most_common(1)[0][1] / sum(answers.values()) < 0.05, (kind, answers.most_common(3))


def _held_out_pairs(env: FlightsEnvironment) -> set[tuple[str, str]]:
    """(entity, answer) of every held-out lookup: a passenger name with its credit or id, a route on a date
    with its cheapest fare."""
    pairs = set()
    for split in ("validation", "test"):
        for task_id in env.task_ids(split):
            task = env.task(task_id)
            if task.kind == "fare_lookup":
                args = task.reference[0][1]
                pairs.add((f"{args['origin']}/{args['destination']}/{args['date']}", task.answer))
            else:
                pairs.add((env.world_of(task).passengers[task.passenger_id].name, task.answer))
    return pairs


def _observed_pairs(observation: str) -> set[tuple[str, str]]:
    """The (entity, value) pairs an observation shows, in the same keys as `_held_out_pairs`."""
    try:
        data = json.loads(observation)
    except ValueError:
        return set()
    records = data if isinstance(data, list) else [data]
    pairs = set()
    for r in records:
        if not isinstance(r, dict):
            continue
        if "price" in r and "origin" in r:
            pairs.add((f"{r['origin']}/{r['destination']}/{r['date']}", str(r["price"])))
        if "name" in r:
            pairs |= {(r["name"], str(r.get("travel_credit"))), (r["name"], str(r.get("passenger_id")))}
    return pairs


def test_no_held_out_answer_is_shown_by_any_train_task_over_http(tmp_path):
    """Everything an explorer can see in a train task (its prompt, its passenger's record, every route on
    every date it sells) holds no held-out task's (entity, answer) pair."""
    env = FlightsEnvironment(V2)
    held_out = _held_out_pairs(env)
    assert len(held_out) == 24
    routes = [(a, b) for a in AIRPORTS for b in AIRPORTS if a != b]
    with run_env_service(yaml.safe_dump({"env_service": {"environments": {"flights": V2}}}), tmp_path) as svc:

        async def scenario() -> tuple[int, set[tuple[str, str]]]:
            seen: set[tuple[str, str]] = set()
            observations = 0
            async with EnvClient(svc.url) as client:
                train = await client.task_ids("flights", "train")
                assert train == env.task_ids("train")
                for task_id in train[:12]:  # the other half keeps the test short; each world is as likely to leak
                    created = await client.create("flights", task_id, {"max_steps": 2 + len(routes)})
                    try:
                        text = " ".join(m.text() for m in created.messages)
                        assert not any(entity in text for entity, _ in held_out)
                        calls = [_call(*env.task(task_id).reference[0])]
                        calls += [_call("search_flight", {"origin": a, "destination": b}) for a, b in routes]
                        for call in calls:
                            result = await client.step(created.instance_id, call)
                            observations += 1
                            assert not result.done, "every search must be answered"
                            seen |= _observed_pairs(result.observation.text())
                    finally:
                        await client.release(created.instance_id)
            return observations, seen

        observations, seen = asyncio.run(scenario())
    assert observations == 12 * (1 + len(routes))
    # The searches did show fares and the look-ups passengers: the check looked at real records.
    assert sum(1 for e, _ in seen if "/" in e) > 3000 and sum(1 for e, _ in seen if "/" not in e) >= 12
    assert not held_out & seen, sorted(held_out & seen)[:5]


def test_strict_grading_over_http_a_hedge_scores_zero(tmp_path):
    env = FlightsEnvironment(V2)
    with run_env_service(yaml.safe_dump({"env_service": {"environments": {"flights": V2}}}), tmp_path) as svc:

        async def scenario() -> None:
            async with EnvClient(svc.url) as client:
                info = await client.describe("flights")
                assert (info["info"]["version"], info["info"]["grading"]) == (2, "strict")
                for kind in ("credit_lookup", "fare_lookup", "id_lookup"):
                    task = next(env.task(i) for i in env.task_ids("validation") if env.task(i).kind == kind)
                    call = _call(*task.reference[0])
                    other = "P1000" if task.answer != "P1000" else "P9999"
                    if task.answer.isdigit():
                        other = str(int(task.answer) + 5)
                    replies = {f"The answer is {task.answer}.": 1.0,
                               f"It is {task.answer} (on {split_dates('validation')[0]}).": 1.0,
                               f"It is {task.answer}, not {other}.": 0.0,  # a hedge: the lenient grader passed it
                               f"{other}": 0.0}
                    for reply, expected in replies.items():
                        assert answer_alone(reply, task.answer) == bool(expected), reply
                        created = await client.create("flights", task.task_id)
                        try:
                            await client.step(created.instance_id, call)
                            result = await client.step(created.instance_id, reply)
                            assert result.done and result.reward == expected, (kind, reply)
                            assert (await client.evaluate(created.instance_id)).score == expected
                        finally:
                            await client.release(created.instance_id)

        asyncio.run(scenario())


def test_v1_is_the_default_and_unchanged():
    v1 = FlightsEnvironment({"tiers": [1]})
    assert (v1.version, v1.grading, len(v1.world.passengers)) == (1, "lenient", 40)
    assert v1.task("validation-t1-0000").world is None
    with pytest.raises(ValueError, match="flights version must be 1"):
        FlightsEnvironment({"version": 3})
    with pytest.raises(ValueError, match="flights grading must be"):
        FlightsEnvironment({"version": 2, "grading": "loose"})
