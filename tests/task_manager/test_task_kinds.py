"""Self-questioning that asks what the environment asks: lookup kinds and forms read from the environment's
train tasks, a curriculum that learns from pass rates which kinds are solvable, and the funnel per kind.

Units: the profile's templates classify flights v2's own queries; unsolved-kind weights by hand. Then over
HTTP on flights v2 (env service and task manager as processes): a synthesize job writes only lookups of the
kinds and form the train split asks, the job and `/v1/stats` report the funnel per kind, and feedback of
unsolved rollouts moves the sampling away from that kind.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest
import yaml

from common.schemas import Task
from env_service.environments.flights import FlightsEnvironment
from task_manager.client import TaskClient
from task_manager.curriculum import sample_batch, task_key, task_weights, unsolved_kinds
from task_manager.kinds import asked_kinds, classify, lookup_kinds
from task_manager.profile import load_profile_file
from task_manager.service import BUILTIN_PROFILES
from task_manager.settings import CurriculumSettings
from tests.helpers import run_service
from tests.task_manager.conftest import write_conf

PROFILE = load_profile_file(BUILTIN_PROFILES / "flights.json")
ASKED = {("fare_lookup", "names"), ("credit_lookup", "names"), ("id_lookup", "names")}


def test_the_profiles_templates_classify_the_environments_own_queries():
    env = FlightsEnvironment({"version": 2, "tiers": [1, 2, 3], "splits": {"train": 12}})
    queries = [env.task(i).query for i in env.task_ids("train")]
    # Tiers 2 and 3 are the profile's multi-call kinds, but for book_constrained, which it does not write.
    multicall = {("book_by_id", "ids"), ("cancel_by_id", "ids"), ("book_cheapest", "names"), ("cancel", "names"),
                 ("rebook", "names")}
    assert set(asked_kinds(PROFILE, queries)) == ASKED | multicall
    assert sum(asked_kinds(PROFILE, queries).values()) == 4 + 4 + 3
    # The label names the call's tool and argument names, never a value.
    assert lookup_kinds(PROFILE)[("credit_lookup", "names")][2] == "credit_lookup:get_passenger(name):names"
    assert lookup_kinds(PROFILE)[("credit_lookup", "ids")][2] == "credit_lookup:get_passenger(passenger_id):ids"
    assert classify(PROFILE, "How much  travel credit does Ann Lee have? Reply with the amount in USD.") == \
        ("credit_lookup", "names")
    assert classify(PROFILE, "How much travel credit does Ann Lee have?") is None  # not the template's wording


def _task(i: int, kind: str) -> Task:
    return Task(task_id=f"{kind}-{i}", env_type="e", synthetic=True, query="q", seed_task_id="o0",
                metadata={"task_kind": kind})


def test_a_kind_never_solved_in_its_tries_is_down_weighted():
    tasks = [_task(i, "fare") for i in range(3)] + [_task(i, "credit") for i in range(2)] + [_task(0, "id")]
    curriculum = CurriculumSettings(unsolved_after=10, unsolved_weight=0.05, outside_weight=0.25, unseen_weight=1.0)
    # fare: 6 + 4 tries, none solved -> unsolved (10 >= 10); credit: 12 tries, one solved -> learnable;
    # id: 8 tries, none solved, but fewer than 10 -> not yet.
    tries = {task_key(tasks[0]): (6, 0), task_key(tasks[1]): (4, 0), task_key(tasks[3]): (12, 1),
             task_key(tasks[5]): (8, 0)}
    rates = {task_key(tasks[0]): (0.0, 6), task_key(tasks[1]): (0.0, 4), task_key(tasks[3]): (0.5, 12),
             task_key(tasks[5]): (0.0, 8)}
    assert unsolved_kinds(tasks, tries, curriculum) == {"fare": 10}
    # fare (all three, the unseen one too) 0.05; credit in band 1, unseen credit 1; id outside the band 0.25.
    assert task_weights(tasks, rates, curriculum, unsolved_kinds(tasks, tries, curriculum)) == \
        [0.05, 0.05, 0.05, 1.0, 1.0, 0.25]
    assert unsolved_kinds(tasks, tries, curriculum.model_copy(update={"unsolved_after": 0})) == {}
    assert unsolved_kinds(tasks, tries, curriculum.model_copy(update={"enabled": False})) == {}
    plan = sample_batch([], tasks, rates, 4, 1.0, False, curriculum, random.Random(0), tries)
    assert plan.unsolved_kinds == {"fare": 10}


@pytest.fixture(scope="module")
def flights_v2(tmp_path_factory: pytest.TempPathFactory):
    conf = tmp_path_factory.mktemp("env") / "env.yaml"
    flights = {"version": 2, "tiers": {1: 0.5, 3: 0.5}, "splits": {"train": 24, "validation": 8, "test": 8}}
    conf.write_text(yaml.safe_dump({"env_service": {"environments": {"flights": flights}}}))
    with run_service("env_service", ["--conf", str(conf)]) as service:
        yield service


def test_lookups_of_the_asked_kinds_a_funnel_per_kind_and_feedback_that_moves_sampling(flights_v2, tmp_path):
    conf = write_conf(tmp_path / "tm.yaml", flights_v2.url, tmp_path / "tm", dedup={"embeddings": False},
                      synthesis={"kinds": ["lookup"], "lookup_kinds": "train", "max_lookups": 8},
                      curriculum={"unsolved_after": 16, "unsolved_weight": 0.02})
    with run_service("task_manager", ["--conf", str(conf)]) as tm:

        async def scenario() -> None:
            async with TaskClient(tm.url) as tasks:
                job = await tasks.wait_job((await tasks.submit_job("flights", episodes=6)).job_id, timeout=120)
                assert job.status == "done", job
                synthetic = (await tasks.list_tasks(env="flights", synthetic=True, limit=1000)).tasks
                # Only the kinds and the form (names, though query_forms is left at ids) the train split asks.
                assert job.progress["asked_kinds"] == {"fare_lookup/names": 4, "credit_lookup/names": 4,
                                                       "id_lookup/names": 4}
                asked = {(t.metadata["lookup"], t.metadata["query_form"]) for t in synthetic}
                assert asked <= ASKED and len(asked) >= 2, asked
                labels = Counter(t.metadata["task_kind"] for t in synthetic)
                assert set(labels) <= {lookup_kinds(PROFILE)[k][2] for k in ASKED}
                # The funnel per kind, in the job and in the service's stats (kept = stored, by kind).
                by_kind = job.progress["by_kind"]
                assert {k: v["kept"] for k, v in by_kind.items() if v["kept"]} == dict(labels)
                assert all(v["proposed"] >= v["verified"] >= v["kept"] for v in by_kind.values())
                stats = (await tasks.stats())["funnel_by_kind"]
                assert {k: v["trainable"] for k, v in stats.items() if v["trainable"]} == dict(labels)
                # The train tasks carry their kind too: the 12 of tier 1, and the 9 of tier 3's multi-call kinds
                # (book_constrained, which the profile does not write, none).
                originals = (await tasks.list_tasks(env="flights", synthetic=False, limit=1000)).tasks
                assert sum("task_kind" in t.metadata for t in originals) == 12 + 9

                # Feedback: the most common kind is tried 16 times, never solved -> sampled far less.
                target = labels.most_common(1)[0][0]

                async def share() -> tuple[float, dict[str, int]]:
                    picked, unsolved = [], {}
                    for seed in range(30):
                        batch = await tasks.sample_batch_detail(4, env="flights", synthetic_ratio=1.0, seed=seed)
                        picked += [t.metadata["task_kind"] == target for t in batch.tasks]
                        unsolved = batch.unsolved_kinds
                    return sum(picked) / len(picked), unsolved

                before, unsolved = await share()
                assert unsolved == {}
                of_kind = [t.task_id for t in synthetic if t.metadata["task_kind"] == target]
                outcomes = {of_kind[i % len(of_kind)]: [] for i in range(16)}
                for i in range(16):
                    outcomes[of_kind[i % len(of_kind)]].append(0.0)
                await tasks.feedback(outcomes, env_type="flights")
                after, unsolved = await share()
                assert unsolved == {target: 16}
                assert after < before / 2, (before, after)
                assert (await tasks.stats())["funnel_by_kind"][target]["tries"] == 16

        asyncio.run(scenario())


def test_solved_rollouts_are_counted_and_an_older_store_gains_the_column(tmp_path):
    import sqlite3

    from task_manager.store import TaskStore

    path = tmp_path / "tasks.sqlite"
    old = sqlite3.connect(str(path))  # a store written before solved rollouts were counted
    old.execute("CREATE TABLE pass_rates (task_id TEXT PRIMARY KEY, recent TEXT NOT NULL, total INTEGER NOT NULL, "
                "updated_at REAL NOT NULL)")
    old.execute("INSERT INTO pass_rates VALUES ('e/a', '[0.0, 1.0]', 2, 0)")
    old.commit()
    old.close()
    store = TaskStore(path)
    try:
        assert store.tries() == {"e/a": (2, 0)}  # outcomes before the column: tried, none counted solved
        store.record_outcomes({"e/a": [1.0, 0.5, 0.0], "e/b": [1.0]}, window=8)
        assert store.tries() == {"e/a": (5, 1), "e/b": (1, 1)}  # a partial reward is no solve
    finally:
        store.close()
