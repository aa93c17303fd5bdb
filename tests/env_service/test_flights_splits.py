"""Flights splits do not share questions: no task of one split asks what a task of another split asks.

The expected counts were measured on the code before the fix (commit 41583fa), e.g. with `tiers: [1]`
43 train tasks asked a validation question and 18 test tasks did too; validation is kept task for task.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import pytest

from env_service.environments.flights import FlightsEnvironment
from env_service.environments.flights.tasks import FlightTask, questions

SPLITS = ("train", "validation", "test")


def _fingerprint(env: FlightsEnvironment, split: str) -> str:
    rows = [[i, t.kind, t.query, t.passenger_id, t.preload, t.reference, t.target_flight, t.answer, t.wrong_answers]
            for i in env.task_ids(split) for t in [env.task(i)]]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def _unexcluded(env: FlightsEnvironment, task_id: str) -> FlightTask:
    """The task the id named before splits excluded each other's questions."""
    split, tier, index = env._parse_id(task_id)
    return env.generator.generate(split, index, tier)


# config -> (tasks per split and tier, validation fingerprint on the code before the fix,
#            test tasks and train tasks redrawn because their draw asked an earlier split's question)
CASES = {
    "default": ({}, {"train": {3: 240}, "validation": {3: 40}, "test": {3: 80}}, "18c3b3013fed0bce", 0, 0),
    "tier 1": ({"tiers": [1]}, {"train": {1: 240}, "validation": {1: 40}, "test": {1: 80}},
               "4712be2eecc797a2", 18, 133),
    "tier 2": ({"tiers": [2]}, {"train": {2: 240}, "validation": {2: 40}, "test": {2: 80}},
               "54e986294c1f7f9e", 0, 4),
    "tier 3": ({"tiers": [3]}, {"train": {3: 240}, "validation": {3: 40}, "test": {3: 80}},
               "de49b143f7a15e0e", 0, 0),
    "tiers 1, 2 (the ablation's)": ({"tiers": [1, 2]},
                                    {"train": {1: 120, 2: 120}, "validation": {1: 20, 2: 20}, "test": {1: 40, 2: 40}},
                                    "47ba0e766d9d3ebe", 5, 37),
    "tiers 1, 2, 3": ({"tiers": [1, 2, 3]}, {"train": {1: 80, 2: 80, 3: 80}, "validation": {1: 14, 2: 13, 3: 13},
                                             "test": {1: 27, 2: 27, 3: 26}}, "2d7bac0b3aa249b5", 1, 18),
}


@pytest.mark.parametrize("name", list(CASES))
def test_no_question_in_two_splits_and_held_out_tasks_kept(name):
    config, counts, validation_fp, test_redrawn, train_redrawn = CASES[name]
    env = FlightsEnvironment(config)
    tasks = {s: [env.task(i) for i in env.task_ids(s)] for s in SPLITS}
    assert {s: dict(Counter(t.tier for t in ts)) for s, ts in tasks.items()} == counts
    asked = {s: frozenset().union(*(questions(t) for t in ts)) for s, ts in tasks.items()}
    for a, b in (("train", "validation"), ("train", "test"), ("validation", "test")):
        assert asked[a].isdisjoint(asked[b]), f"{name}: {a} and {b} share {sorted(asked[a] & asked[b])[:3]}"
        queries = {t.query for t in tasks[a]}
        assert not [t for t in tasks[b] if t.query in queries]

    # Validation is the task list it was, task for task; test and train change only where they leaked.
    assert _fingerprint(env, "validation") == validation_fp
    earlier = {"test": asked["validation"], "train": asked["validation"] | asked["test"]}
    for split, expected in (("test", test_redrawn), ("train", train_redrawn)):
        redrawn = 0
        for task_id, task in zip(env.task_ids(split), tasks[split], strict=True):
            before = _unexcluded(env, task_id)
            leaked = not questions(before).isdisjoint(earlier[split])
            assert (task != before) == leaked, f"{task_id} changed although it asked nothing held out"
            assert (task.kind, task.tier) == (before.kind, before.tier)
            redrawn += leaked
        assert redrawn == expected, f"{name}: {split} tasks redrawn"


def test_questions_name_what_a_task_asks_whatever_the_wording():
    def task(kind: str, query: str, passenger: str = "P1003", target: str | None = None, **kw) -> FlightTask:
        return FlightTask("train-0000", kind, query, passenger, target_flight=target, **kw)

    by_name = task("book_cheapest", "Please book ... for Chen Smith.", target="UA120-0603")
    by_id = task("book_by_id", "Please book ... for passenger P1003.", target="UA120-0603")
    assert questions(by_name) & questions(by_id) == {("book", "P1003", "UA120-0603")}
    assert questions(by_id).isdisjoint(questions(task("book_by_id", "other", target="UA999-0603")))
    credit, ident = task("credit_lookup", "How much?"), task("id_lookup", "Which id?")
    assert questions(credit) == {("query", "How much?"), ("credit", "P1003")}
    assert questions(credit).isdisjoint(questions(ident)), "credit and id of one passenger are two questions"
    fare = task("fare_lookup", "Cheapest?", reference=(("search_flight", {"origin": "SFO", "destination": "JFK",
                                                                         "date": "2025-06-03"}),))
    assert ("fare", "SFO", "JFK", "2025-06-03") in questions(fare)
    rebook = task("rebook", "Move it.", target="DL7-0605", preload=(("P1003", "AA5-0603"),))
    assert ("rebook", "P1003", "AA5-0603", "DL7-0605") in questions(rebook)


def test_train_with_every_question_held_out_is_a_config_error():
    # 100 tier-1 credit questions in validation name nearly all 40 passengers, test takes the rest.
    with pytest.raises(ValueError, match="credit_lookup question drawn is already asked by another split"):
        FlightsEnvironment({"tiers": [1], "splits": {"train": 10, "validation": 300, "test": 30}})
