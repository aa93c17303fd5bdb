"""The `bfcl` environment in-process: data, splits, episode protocol, checker, state and cache hygiene."""

from __future__ import annotations

import json

import pytest

from common.schemas import ChatMessage
from env_service.environments.bfcl import BfclEnvironment
from env_service.environments.bfcl.backend import live_cache_entries
from tests.env_service.bfcl_ground_truth import NO_CALL, turn_message

CATEGORY_SIZES = {"multi_turn_base": 200, "multi_turn_miss_func": 200, "multi_turn_miss_param": 200,
                  "multi_turn_long_context": 200}


@pytest.fixture(scope="module")
def env() -> BfclEnvironment:
    return BfclEnvironment()


def say(text: str) -> ChatMessage:
    return ChatMessage(role="assistant", content=text)


def replay(env: BfclEnvironment, task_id: str, style: str = "bfcl"):
    task = env.tasks[task_id]
    instance = env.create(task_id)
    instance.reset()
    result = None
    for turn in task.ground_truth:
        if turn:
            result = instance.step(ChatMessage.model_validate(turn_message(turn, task.involved_classes, style)))
            assert not result.done
        result = instance.step(ChatMessage.model_validate(NO_CALL))
    return instance, result


def test_all_800_tasks_with_bfcl_ids_and_deterministic_disjoint_splits(env):
    assert len(env.tasks) == 800
    for category, size in CATEGORY_SIZES.items():
        ids = [tid for tid, task in env.tasks.items() if task.category == category]
        assert len(ids) == size and f"{category}_0" in ids and f"{category}_199" in ids
    splits = {s: env.task_ids(s) for s in ("train", "validation", "test")}
    assert sorted(sum(splits.values(), [])) == sorted(env.tasks)
    assert {s: len(v) for s, v in splits.items()} == {"train": 560, "validation": 80, "test": 160}
    for ids in splits.values():  # stratified: every category in the same proportion
        assert {c: sum(t.startswith(c + "_") for t in ids) for c in CATEGORY_SIZES} == \
               {c: len(ids) // 4 for c in CATEGORY_SIZES}
    assert BfclEnvironment().task_ids("test") == splits["test"]
    assert BfclEnvironment({"split_seed": 1}).task_ids("test") != splits["test"]


def test_config_selects_categories_and_rejects_bad_values():
    only_base = BfclEnvironment({"categories": ["base"]})
    assert len(only_base.tasks) == 200 and all(t.startswith("multi_turn_base_") for t in only_base.tasks)
    with pytest.raises(KeyError, match="multi_turn_base_0"):
        only_base.create("multi_turn_miss_func_0")
    with pytest.raises(ValueError, match="unknown BFCL category 'bogus'"):
        BfclEnvironment({"categories": ["bogus"]})
    with pytest.raises(ValueError, match="sum to 1"):
        BfclEnvironment({"split_fractions": {"train": 0.9, "validation": 0.9, "test": 0.0}})
    with pytest.raises(ValueError, match="max_steps_per_turn"):
        BfclEnvironment({"max_steps_per_turn": 0})


def test_reset_is_system_then_user_with_the_task_tool_docs(env):
    messages = env.create("multi_turn_base_0").reset()
    assert [m.role for m in messages] == ["system", "user"]
    assert messages[1].content == env.tasks["multi_turn_base_0"].turns[0][0]["content"]
    assert '"name": "mkdir"' in messages[0].content and '"name": "post_tweet"' in messages[0].content
    names = {tool["function"]["name"] for tool in env.tool_docs("multi_turn_base_0")}
    assert {"cd", "mv", "post_tweet"} <= names
    assert all(tool["function"]["parameters"]["type"] == "object" for tool in env.tool_docs("multi_turn_base_0"))


def test_miss_func_holds_functions_back_until_bfcl_says(env):
    task = env.tasks["multi_turn_miss_func_0"]
    assert task.held_out == {3: ["sort"]}
    instance = env.create(task.task_id)
    system, _ = instance.reset()
    assert '"name": "sort"' not in system.content
    held = [t for t in env.tool_docs(task.task_id) if t.get("available_from_turn") == 3]
    assert [t["function"]["name"] for t in held] == ["sort"]
    observations = [instance.step(say("Nothing to call.")).observation for _ in range(3)]
    assert observations[2].role == "user" and '"name": "sort"' in observations[2].content
    assert "I have updated some more functions" in observations[2].content


@pytest.mark.parametrize("style", ["bfcl", "tool_call", "openai"])
def test_ground_truth_replay_scores_one_in_every_action_format(env, style):
    for task_id in ("multi_turn_base_0", "multi_turn_miss_func_49", "multi_turn_miss_param_7",
                    "multi_turn_long_context_3"):
        instance, last = replay(env, task_id, style)
        assert last.done and last.reward == 1.0, (task_id, last.info)
        assert instance.evaluate().score == 1.0
        instance.close()


def test_every_ground_truth_replays_to_one_and_leaves_no_cached_backends(env):
    before = live_cache_entries()
    failures = []
    for task_id in env.tasks:
        instance, last = replay(env, task_id)
        result = instance.evaluate()
        if result.score != 1.0:
            failures.append((task_id, result.info))
        instance.close()
    assert failures == []
    assert live_cache_entries() == before


def test_a_wrong_sequence_scores_zero_with_a_state_mismatch(env):
    instance = env.create("multi_turn_base_0")
    instance.reset()
    instance.step(say("[cd(folder='document')]"))  # skips the mkdir and mv the user asked for
    for _ in env.tasks["multi_turn_base_0"].turns:
        last = instance.step(say("done"))
    assert last.done and last.reward == 0.0
    result = instance.evaluate()
    assert result.score == 0.0
    assert result.info["error_type"] == "multi_turn:instance_state_mismatch"
    json.dumps(result.info)  # the checker's details are made JSON-able
    instance.close()


def test_several_calls_give_one_tool_message_and_state_follows(env):
    instance = env.create("multi_turn_base_0")
    instance.reset()
    before = instance.state()
    result = instance.step(say("[cd(folder='document'), mkdir(dir_name='temp')]"))
    assert result.observation.role == "tool" and not result.done
    outputs = json.loads(result.observation.content)
    assert [o["call"] for o in outputs] == ["cd(folder='document')", "mkdir(dir_name='temp')"]
    assert "document" in outputs[0]["result"]
    after = instance.state()
    json.dumps(after)
    assert after != before
    def document(state):  # the file system's root is the `workspace` directory
        return state["GorillaFileSystem"]["root"]["contents"]["document"]["contents"]

    assert "temp" in document(after) and "temp" not in document(before)
    instance.close()


def test_malformed_and_foreign_calls_are_explained_never_run(env, tmp_path):
    instance = env.create("multi_turn_base_0")
    instance.reset()
    bad = instance.step(say("[cd(folder=document)]"))
    assert bad.observation.role == "tool" and "Could not parse" in bad.observation.content and not bad.done
    target = tmp_path / "should_not_exist.txt"
    foreign = instance.step(say(f"[open(file='{target}', mode='w')]"))
    assert "no function named 'open'" in foreign.observation.content
    assert not target.exists()
    assert instance.decoded == [[]]  # nothing was recorded for the checker either
    instance.close()


def test_replaced_query_is_one_turn_without_ground_truth(env):
    instance = env.create("multi_turn_base_0", {"query": "Make a folder named x."})
    assert instance.reset()[1].content == "Make a folder named x."
    instance.step(say("[mkdir(dir_name='x')]"))
    last = instance.step(say("done"))
    assert last.done
    assert instance.evaluate().info["error_type"] == "no_ground_truth"
    assert "x" in json.dumps(instance.state())
    instance.close()


def test_too_many_steps_in_a_turn_force_terminates():
    env = BfclEnvironment({"categories": ["base"], "max_steps_per_turn": 2})
    instance = env.create("multi_turn_base_0")
    instance.reset()
    results = [instance.step(say("[pwd()]")) for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].reward == 0.0 and results[-1].info["error_type"] == "multi_turn:force_terminated"
    assert instance.step(say("[pwd()]")).done  # a finished episode stays finished
    instance.close()
    malformed = env.create("multi_turn_base_0")
    malformed.reset()
    assert [malformed.step(say("[pwd(]")).done for _ in range(3)] == [False, False, True]
    malformed.close()


def test_unfinished_episode_evaluates_as_force_terminated(env):
    instance = env.create("multi_turn_base_1")
    instance.reset()
    result = instance.evaluate()
    assert result.score == 0.0 and result.info["error_type"] == "multi_turn:force_terminated"
    instance.close()


def test_instances_of_one_task_are_isolated_and_close_frees_their_cache(env):
    before = live_cache_entries()
    first, second = env.create("multi_turn_base_0"), env.create("multi_turn_base_0")
    first.reset(), second.reset()
    assert first.backend.model_name != second.backend.model_name
    assert live_cache_entries() == before + 2 * len(env.tasks["multi_turn_base_0"].involved_classes)
    first.step(say("[cd(folder='document'), mkdir(dir_name='only_in_first')]"))
    assert "only_in_first" in json.dumps(first.state()) and "only_in_first" not in json.dumps(second.state())
    first.close(), second.close()
    assert live_cache_entries() == before


def test_profile_lists_backends_and_their_operations(env):
    profile = env.profile()
    names = {e["name"] for e in profile["entities"]}
    assert {"GorillaFileSystem", "TwitterAPI", "VehicleControlAPI"} <= names
    fs = next(e for e in profile["entities"] if e["name"] == "GorillaFileSystem")
    assert any(o["name"] == "mkdir" for o in fs["opts"])
