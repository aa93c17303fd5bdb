"""Unit tests of the task manager's parts that need no service: parsing, dedup, replay ids, curriculum, store."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from common.config import ConfigError
from common.generated_ids import IdRemapper, same_but_generated_ids
from common.schemas import Task
from env_service.environments.signal import SignalEnvironment
from task_manager.curriculum import kind_rates, sample_batch, task_key, task_rates
from task_manager.dedup import DedupIndex, literal_values, normalize_text
from task_manager.envs import comparable_state
from task_manager.grading import parse_reward, state_match
from task_manager.models import Call, Exploration, ExploreStep, Proposal, Reference, StoredTask
from task_manager.profile import load_profile_file, profile_from_env
from task_manager.settings import CurriculumSettings
from task_manager.store import TaskStore
from task_manager.synthesize import (
    parse_task_blocks,
    signature,
    split_actions,
    synthesis_messages,
    write_query,
)
from task_manager.values import ValuePool, shapes_in


def test_llm_blocks_become_distinct_tasks() -> None:
    # AgentEvolver mutated one shared task per block: every task ended with the last block's query.
    text = "\n".join(
        f'<task>{{"query": "task {i}", "confidence": 0.{i}, "action_sequence": ["f(x={i})", "g(y={i})"]}}</task>'
        for i in range(1, 4)) + '\n<task>{"query": "broken", "confidence": 1}</task>\n<task>not json</task>'
    blocks, parsed = parse_task_blocks(text)
    assert blocks == 5
    assert [p["query"] for p in parsed] == ["task 1", "task 2", "task 3"]
    assert [p["actions"] for p in parsed] == [["f(x=1)", "g(y=1)"], ["f(x=2)", "g(y=2)"], ["f(x=3)", "g(y=3)"]]
    assert len({id(p) for p in parsed}) == 3


def test_action_sequences_in_every_shape() -> None:
    assert split_actions("# step0\nsearch(a='x')\n# step1\nbook(b='y')") == ["search(a='x')", "book(b='y')"]
    assert split_actions("search(a='x')\nbook(b='y')") == ["search(a='x')", "book(b='y')"]
    call = split_actions([{"name": "book", "arguments": {"b": "y"}}])[0]
    assert call.startswith("<tool_call>") and json.loads(call[11:-12]) == {"name": "book", "arguments": {"b": "y"}}
    assert split_actions(None) == [] and split_actions("") == []


def test_synthesis_prompt_masks_the_seed_query() -> None:
    profile = profile_from_env("toy", {"name": "toy"}, [])
    exploration = Exploration(env_type="toy", seed_task_id="t0", explorer="random",
                              initial_messages=[{"role": "user", "content": "SECRET SEED QUERY"}],
                              steps=[ExploreStep(index=0, phase="breadth", action="f()", observation="ok")])
    text = json.dumps(synthesis_messages(exploration, profile, []))
    assert "SECRET SEED QUERY" not in text and "[MASKED]" in text and "f()" in text


def test_dedup_rules() -> None:
    index = DedupIndex(threshold=0.9)
    v = np.ones(384, dtype=np.float32) / np.sqrt(384)
    index.add("Book flight UA100-0602 for passenger P1001.", "sig-a", "goal-a", v, "end-a")
    assert index.duplicate_reason("x", "sig-a", None, None) == "same_reference"
    assert index.duplicate_reason("x", "sig-b", "goal-a", None) == "same_goal"
    assert index.duplicate_reason("book flight  UA100-0602 for passenger P1001", "sig-b", None, None) == "same_text"
    # Same vector, same literals, end state unknown: a paraphrase.
    assert index.duplicate_reason("Please book UA100-0602 for P1001", "sig-c", None, v) == "near_duplicate"
    # Same vector but other literals (another flight): a different task.
    assert index.duplicate_reason("Book flight UA200-0602 for passenger P1001.", "sig-d", None, v) is None
    # Same literals but verified to end in another state: a different task.
    assert index.duplicate_reason("Please book UA100-0602 for P1001", "sig-e", None, v, "end-b") is None
    index.set_heldout(["Cancel order of P1002"], v[None, :])
    assert index.duplicate_reason("cancel order of p1002", "sig-f", None, None) == "contaminated"
    assert index.duplicate_reason("Cancel the order of P1002", "sig-g", None, v, "end-c") == "contaminated"


def test_text_normalization_and_literals() -> None:
    assert normalize_text("  Book, the FLIGHT!  ") == "book the flight"
    assert literal_values("Book UA123-0603 for P1001 from SFO on 2025-06-03") == \
        {"ua123-0603", "p1001", "sfo", "2025-06-03"}


def test_remapper_carries_generated_ids() -> None:
    remapper = IdRemapper()
    remapper.learn('{"order_id": "ORD1001AB12", "price": 120}', '{"order_id": "ORD1001FF34", "price": 120}')
    assert remapper.mapping == {"ORD1001AB12": "ORD1001FF34"}
    assert remapper.apply("cancel_order(order_id='ORD1001AB12')") == "cancel_order(order_id='ORD1001FF34')"
    # A changed plain number is a different outcome, not an id.
    remapper.learn('{"price": 120}', '{"price": 130}')
    assert "120" not in remapper.mapping


def test_results_equal_but_generated_ids() -> None:
    booked = ['{"order_id": "ORD1001AB12", "flight_id": "UA1-0602"}',
              '{"order_id": "ORD1001AB12", "status": "cancelled"}']
    again = ['{"order_id": "ORD1001FF34", "flight_id": "UA1-0602"}',
             '{"order_id": "ORD1001FF34", "status": "cancelled"}']
    assert same_but_generated_ids(booked, again)
    # The order cancelled is not the order booked in that run: not the same results.
    assert not same_but_generated_ids(booked, [again[0], '{"order_id": "ORD1001CD56", "status": "cancelled"}'])
    assert not same_but_generated_ids(booked, [again[0], '{"order_id": "ORD1001FF34", "status": "active"}'])
    assert not same_but_generated_ids(booked, again[:1])


def test_signature_ignores_generated_ids_only() -> None:
    def proposal(order: str, flight: str) -> Proposal:
        calls = [Call(name="book", arguments={"flight_id": flight}), Call(name="cancel", arguments={"order_id": order})]
        return Proposal(query="q", actions=[c.render() for c in calls], calls=calls, generated=[order],
                        synthesizer="hindsight", env_type="flights", seed_task_id="t")

    assert signature(proposal("ORD1", "F1")) == signature(proposal("ORD2", "F1"))
    assert signature(proposal("ORD1", "F1")) != signature(proposal("ORD1", "F2"))


def test_hindsight_query_names_generated_ids_by_their_record() -> None:
    profile = load_profile_file("task_manager/profiles/flights.json")
    book = Call(name="book_ticket", arguments={"passenger_id": "P1003", "flight_id": "UA1-0602"})
    cancel = Call(name="cancel_order", arguments={"order_id": "ORD1001AB"})
    steps = [
        ExploreStep(index=0, phase="breadth", action=book.render(), calls=[book], state_changed=True,
                    observation=json.dumps({"order_id": "ORD1001AB", "passenger_id": "P1003", "flight_id": "UA1-0602"})),
        ExploreStep(index=1, phase="depth", action=cancel.render(), calls=[cancel], state_changed=True,
                    observation=json.dumps({"status": "cancelled"})),
    ]
    query = write_query(profile, steps, {"ORD1001AB"}, None)
    assert query == ("Book a seat on flight UA1-0602 for passenger P1003. Then cancel the order with "
                     "passenger_id P1003 and flight_id UA1-0602.")


def test_value_pool_prefers_keys_then_shapes() -> None:
    pool = ValuePool()
    pool.harvest(json.dumps([{"flight_id": "UA1-0602", "date": "2025-06-02"}]), 0)
    pool.harvest("no passenger P1007 here, try SFO", 1)
    assert pool.candidates("flight_id", "flight id, e.g. UA123-0603") == ["UA1-0602"]
    assert pool.candidates("passenger_id", "passenger id, e.g. P1001") == ["P1007"]
    assert "9-9-9" in shapes_in("travel date YYYY-MM-DD")
    assert pool.candidates("when", "travel date YYYY-MM-DD") == ["2025-06-02"]
    assert pool.candidates("passenger_id", "passenger id, e.g. P1001", since=5) == []


def test_comparable_state_and_state_match() -> None:
    full = {"orders": [{"order_id": "X1", "created_at": 1.0}], "comparable": {"orders": [["P1", "F1"]]}}
    assert comparable_state(full) == {"orders": [["P1", "F1"]]}
    assert comparable_state({"a": {"created_at": 3, "b": 1}}) == {"a": {"b": 1}}
    stored = StoredTask(task=Task(task_id="syn-1", env_type="flights", synthetic=True, query="q"),
                        reference=Reference(actions=["a"], end_state={"orders": [["P1", "F1"]]}))
    keys = ("created_at",)
    assert state_match(stored, full, keys).reward == 1.0
    assert state_match(stored, {"instance_id": "i", "state": full, "state_hash": None}, keys).reward == 1.0
    assert state_match(stored, {"comparable": {"orders": []}}, keys).reward == 0.0


def test_reward_parsing() -> None:
    assert parse_reward("thinking... <reward>85</reward>") == 0.85
    assert parse_reward("<reward>250</reward>") == 1.0
    assert parse_reward("no tag") is None


def _tasks(n: int, synthetic: bool) -> list[Task]:
    return [Task(task_id=f"{'s' if synthetic else 'o'}{i}", env_type="e", synthetic=synthetic,
                 query="q" if synthetic else None, seed_task_id="o0" if synthetic else None) for i in range(n)]


def test_mixture_ratio_and_curriculum_band() -> None:
    originals, synthetic = _tasks(50, False), _tasks(50, True)
    curriculum = CurriculumSettings(low=0.2, high=0.8, outside_weight=0.05)
    plan = sample_batch(originals, synthetic, {}, 20, 0.25, True, curriculum, random.Random(0))
    assert (plan.original, plan.synthetic) == (15, 5)
    assert sum(t.synthetic for t in plan.tasks) == 5
    # Synthetic s0-s9 are learnable, the rest solved: the band dominates yet the rest still appears.
    rates = {task_key(t): (0.5 if int(t.task_id[1:]) < 10 else 1.0, 8) for t in synthetic}
    counts = {"band": 0, "rest": 0}
    rng = random.Random(1)
    for _ in range(200):
        for task in sample_batch(originals, synthetic, rates, 10, 1.0, False, curriculum, rng).tasks:
            counts["band" if int(task.task_id[1:]) < 10 else "rest"] += 1
    assert counts["band"] > 2 * counts["rest"] > 0  # uniform sampling would give band:rest = 1:4
    off = CurriculumSettings(enabled=False)
    counts = {"band": 0, "rest": 0}
    for _ in range(200):
        for task in sample_batch(originals, synthetic, rates, 10, 1.0, False, off, rng).tasks:
            counts["band" if int(task.task_id[1:]) < 10 else "rest"] += 1
    assert counts["rest"] > counts["band"]  # uniform: 40 of 50 tasks are outside the band


def test_by_kind_an_unseen_task_takes_its_kinds_pass_rate() -> None:
    def lookup(i: int, kind: str) -> Task:
        return Task(task_id=f"{kind}-{i}", env_type="e", synthetic=True, query="q", seed_task_id="o0",
                    metadata={"kind": "lookup", "lookup": kind})

    tasks = [lookup(i, "credit") for i in range(10)] + [lookup(i, "fare") for i in range(10)]
    # One credit task seen solved half the time (in band), one fare task never solved in 8 rollouts.
    rates = {task_key(tasks[0]): (0.5, 4), task_key(tasks[1]): (0.25, 4), task_key(tasks[10]): (0.0, 8)}
    assert kind_rates(tasks, rates) == {"credit": (0.375, 8), "fare": (0.0, 8)}
    on = CurriculumSettings(by_kind=True, outside_weight=0.25)
    assert task_rates(tasks, rates, on)[5] == (0.375, 8) and task_rates(tasks, rates, on)[15] == (0.0, 8)
    assert task_rates(tasks, rates, on)[0] == (0.5, 4)  # its own rate when it has one
    assert task_rates(tasks, rates, CurriculumSettings())[5] is None  # off: unseen stays unseen
    counts = {"credit": 0, "fare": 0}
    rng = random.Random(0)
    for _ in range(200):
        for task in sample_batch([], tasks, rates, 2, 1.0, False, on, rng).tasks:
            counts[task.metadata["lookup"]] += 1
    # credit weighs 1 per task, fare 0.25: about 4:1 (uniform would be 1:1)
    assert counts["credit"] > 3 * counts["fare"] > 0


def test_mixture_fills_from_the_other_pool() -> None:
    plan = sample_batch(_tasks(10, False), [], {}, 8, 0.5, True, CurriculumSettings(), random.Random(0))
    assert (plan.original, plan.synthetic) == (8, 0)
    plan = sample_batch([], _tasks(3, True), {}, 8, 0.5, True, CurriculumSettings(), random.Random(0))
    assert plan.synthetic == 8 and len({t.task_id for t in plan.tasks}) == 3


def test_store_survives_reopen(tmp_path) -> None:
    store = TaskStore(tmp_path / "t.sqlite")
    store.create_job("job1", "synthesize", {"env": "e"}, {"kept": 0})
    task = StoredTask(task=Task(task_id="syn-1", env_type="e", synthetic=True, query="q"),
                      reference=Reference(actions=["a"], end_state={"x": 1}, end_state_hash="h"), signature="s")
    with store.transaction() as db:
        store.insert_task(db, task, "g", np.zeros(384, dtype=np.float32))
        store.update_job(db, "job1", cursor=3, progress={"kept": 1}, status="running")
    store.record_outcomes({"e/syn-1": [1.0, 0.0]}, window=3)
    store.record_outcomes({"e/syn-1": [1.0, 1.0]}, window=3)
    store.close()
    store = TaskStore(tmp_path / "t.sqlite")
    assert store.job("job1")["cursor"] == 3 and store.job("job1")["progress"] == {"kept": 1}
    assert store.get("syn-1").reference.end_state == {"x": 1}
    assert store.pass_rates()["e/syn-1"] == (pytest.approx(2 / 3), 4)
    index = store.dedup_index("e", 0.9, 0.9)
    assert index.duplicate_reason("other", "s", None, None) == "same_reference"


@pytest.mark.parametrize("config", [{"options": ["north", "south"]},
                                    {"options": ["north", "south"], "labels": ["river", "wind"], "fields": 2}])
def test_signal_profile_is_a_task_manager_profile(config) -> None:
    # Its attrs once held the options list where the profile schema wants a description string.
    profile = profile_from_env("signal", SignalEnvironment(config).profile(), [])
    assert profile.entities[0].attrs == {"options": "one of north, south"}
    assert "one of north, south" in profile.instruction()


def test_profiles(tmp_path) -> None:
    profile = load_profile_file("task_manager/profiles/flights.json")
    assert {"search_flight", "book_ticket", "cancel_order"} <= set(profile.operations())
    assert "book_ticket" in profile.instruction()
    derived = profile_from_env("toy", {"name": "toy", "entities": []},
                               [{"type": "function", "function": {"name": "poke", "description": "Poke it."}}])
    assert derived.operations()["poke"].description == "Poke it."
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_profile_file(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_profile_file(tmp_path / "missing.json")
