"""The suite adapters and text worlds in process: the free-text action parser (hand-written cases),
seeded splits, the missing-package error, and one played episode per environment whose outcome is
known (a scripted solver, or a fixed wrong play)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from common.config import ConfigError
from common.schemas import ChatMessage
from env_service.environments.textgames import SuiteEnvironment, TaskSplits, extract_wrapped, match_choice
from env_service.registry import load_environments

SMALL = {"train": 2, "validation": 1, "test": 2}
COMMANDS = {c: c for c in ("go north", "go east", "take apple", "open red box", "look")}


def say(text: str) -> ChatMessage:
    return ChatMessage(role="assistant", content=text)


@pytest.mark.parametrize(("reply", "action", "kind"), [
    ("go north", "go north", "exact"),
    ("Action: Take apple.", "take apple", "exact"),
    ("**Action:** `look`", "look", "exact"),
    ("I think I should go east now", "go east", "mapped"),           # a valid command inside the sentence
    ("Let me open the box.\nAction: open red box please", "open red box", "mapped"),
    ("take aple", "take apple", "mapped"),                           # one typo: closest command
    ("dance wildly", None, "invalid"),
    ("", None, "invalid"),
])
def test_match_choice_classifies_replies(reply, action, kind):
    parsed = match_choice(reply, COMMANDS)
    assert (parsed.action, parsed.kind) == (action, kind)


def test_match_choice_prefers_the_longest_command_named():
    choices = {"open box": 1, "open red box": 2}
    assert match_choice("I will open red box", choices).action == 2


def test_match_choice_rejects_an_echo_that_names_several_commands():
    # SmolLM2's 32-token reply in TextWorld: the observation echoed up to its list of valid commands.
    # The longest command in it ("examine coin") used to be played as a mapped action.
    echo = ("You've just shown up in a washroom.\n\nThere is a coin on the floor.\n"
            "Valid commands: examine coin, inventory, look, take")
    choices = {c: c for c in ("examine coin", "inventory", "look", "take coin")}
    assert (match_choice(echo, choices).action, match_choice(echo, choices).kind) == (None, "invalid")
    assert match_choice("I go north, then I take apple", COMMANDS).kind == "invalid"
    # Several phrases of the same action are one action (BabyAI's synonyms).
    synonyms = {"turn left": 0, "left": 0, "go forward": 2}
    assert (match_choice("I should turn left, yes, left", synonyms).action,
            match_choice("I should turn left, yes, left", synonyms).kind) == (0, "mapped")


def test_extract_wrapped_passes_wrapped_replies_and_wraps_the_rest():
    boxed = re.compile(r"\\boxed\{[^{}]*\}")
    wrap = lambda s: f"\\boxed{{{s}}}"  # noqa: E731
    assert extract_wrapped("so \\boxed{7}", boxed, wrap).kind == "exact"
    mapped = extract_wrapped("Thinking...\nAnswer: 7.", boxed, wrap)
    assert (mapped.action, mapped.kind) == ("\\boxed{7}", "mapped")
    assert extract_wrapped("   \n ", boxed, wrap).kind == "invalid"


def test_task_splits_are_disjoint_seed_ranges_and_reject_unknown_ids():
    splits = TaskSplits(["a", "b"], SMALL)
    assert splits.ids("test") == ["a/test-0000", "a/test-0001", "b/test-0000", "b/test-0001"]
    seeds = {s: {splits.parse(t)[2] for t in splits.ids(s)} for s in ("train", "validation", "test")}
    assert seeds["train"] == {0, 1} and seeds["validation"] == {100_000} and seeds["test"] == {200_000, 200_001}
    for bad in ("a/test-0002", "c/train-0000", "a/train-1", "a/dev-0000"):
        with pytest.raises(KeyError, match="ids look like a/train-0000"):
            splits.parse(bad)


class _NeedsAbsentPackage(SuiteEnvironment):
    name = "absent"
    module = "evolver_package_that_does_not_exist"
    distribution = "evolver-package-that-does-not-exist"
    default_envs = ("x",)

    def check_env_id(self, env_id: str) -> str:
        return env_id

    def instance(self, *args: Any) -> Any:
        raise AssertionError("never reached")


def test_a_missing_package_fails_at_start_naming_the_extra():
    with pytest.raises(ValueError, match=r"needs the 'evolver-package-that-does-not-exist' package.*evolver\[envs\]"):
        _NeedsAbsentPackage({})
    with pytest.raises(ConfigError, match=r"environments\.absent: .*pip install 'evolver\[envs\]'"):
        load_environments({"absent": {}}, {"absent": f"{__name__}:_NeedsAbsentPackage"})


@pytest.mark.parametrize(("name", "config", "message"), [
    ("gem", {"envs": ["math:GSM8K"]}, "not an offline GEM environment id"),
    ("reasoning_gym", {"envs": ["no_such_task"]}, "not a reasoning-gym dataset"),
    ("textarena", {"envs": ["TicTacToe-v0"]}, "cannot run as a single-player game"),
    ("textworld", {"envs": ["tw-cooking"]}, "not a TextWorld game id"),
    ("babyai", {"envs": ["CartPole-v1"]}, "not a registered BabyAI/MiniGrid id"),
    ("gem", {"levels": 3}, "unknown gem config key"),
])
def test_bad_env_ids_and_keys_fail_at_start_with_the_reason(name, config, message):
    with pytest.raises(ConfigError, match=message):
        load_environments({name: config})


def _play(env: Any, task_id: str, policy) -> tuple[Any, list[Any]]:
    instance = env.create(task_id)
    messages = instance.reset()
    assert [m.role for m in messages] == ["system", "user"]
    results, observation = [], messages[1].text()
    for _ in range(env.max_turns):
        result = instance.step(say(policy(instance, observation)))
        results.append(result)
        observation = result.observation.text()
        if result.done:
            break
    return instance, results


def test_gem_guess_the_number_solved_by_bisection_with_mapped_and_exact_moves():
    env = load_environments({"gem": {"envs": ["game:GuessTheNumber-v0-easy"], "splits": SMALL}})["gem"]
    bounds = {"lo": 1, "hi": 10, "turn": 0}

    def bisect(_instance: Any, observation: str) -> str:
        if bounds["turn"] and "higher" in observation:
            bounds["lo"] = bounds["guess"] + 1
        elif bounds["turn"] and "lower" in observation:
            bounds["hi"] = bounds["guess"] - 1
        bounds["guess"] = (bounds["lo"] + bounds["hi"]) // 2
        bounds["turn"] += 1
        # Alternate a bare number (wrapped by us: mapped) with GEM's own \boxed{} (exact).
        return f"Action: {bounds['guess']}" if bounds["turn"] % 2 else f"\\boxed{{{bounds['guess']}}}"

    instance, results = _play(env, "game:GuessTheNumber-v0-easy/test-0000", bisect)
    evaluation = instance.evaluate()
    assert evaluation.score == 1.0 and results[-1].done and results[-1].reward == 1.0
    turns = len(results)
    assert evaluation.info["mapped_actions"] == (turns + 1) // 2 and evaluation.info["invalid_actions"] == 0
    assert evaluation.info["mapped_action_rate"] == pytest.approx(((turns + 1) // 2) / turns)
    assert instance.state_hash() is not None


def test_reasoning_gym_scores_with_its_own_verifier_and_gives_feedback_attempts():
    env = load_environments({"reasoning_gym": {"envs": ["basic_arithmetic"], "attempts": 2, "splits": SMALL}})[
        "reasoning_gym"]
    instance, results = _play(env, "basic_arithmetic/test-0001",
                              lambda inst, _obs: "Answer: not a number" if not inst.answers
                              else f"<answer>{inst.entry['answer']}</answer>")
    assert [r.reward for r in results] == [0.0, 1.0] and "not correct" in results[0].observation.text()
    assert instance.evaluate().score == 1.0
    # Same task id, same question: the split is a stable seed.
    assert env.create("basic_arithmetic/test-0001").reset()[1].text() == \
        env.create("basic_arithmetic/test-0001").reset()[1].text()


def test_textarena_tower_of_hanoi_solved_by_its_known_moves():
    env = load_environments({"textarena": {"envs": ["TowerOfHanoi-v0"], "splits": SMALL}})["textarena"]
    moves = iter(["[A C]", "[A B]", "[C B]", "[A C]", "Action: B A", "[B C]", "[A C]"])
    instance, results = _play(env, "TowerOfHanoi-v0/test-0000", lambda *_: next(moves))
    evaluation = instance.evaluate()
    assert evaluation.score == 1.0 and len(results) == 7
    assert evaluation.info["mapped_actions"] == 1 and evaluation.info["invalid_actions"] == 0


def test_babyai_view_in_words_and_an_unsolved_episode_ends_at_max_turns():
    env = load_environments({"babyai": {"envs": ["BabyAI-GoToRedBallNoDists-v0"], "max_turns": 5,
                                        "splits": SMALL}})["babyai"]
    replies = iter(["Action: turn left", "I turn left", "turn lft", "sing", "turn left"])
    instance, results = _play(env, "BabyAI-GoToRedBallNoDists-v0/train-0000", lambda *_: next(replies))
    fresh = env.create("BabyAI-GoToRedBallNoDists-v0/train-0000")
    first = fresh.reset()[1].text()
    assert first.startswith("Mission: go to the red ball.") and "You see a red ball 4 steps ahead" in first
    assert len(results) == 5 and results[-1].done
    assert [r.info["action_kind"] for r in results] == ["exact", "mapped", "mapped", "invalid", "exact"]
    info = instance.evaluate().info
    assert (info["mapped_actions"], info["invalid_actions"]) == (2, 1) and instance.evaluate().score == 0.0
    # Four left turns (the invalid reply moved nothing): facing where it started, on the same cell.
    assert instance.state() == fresh.state()


@pytest.mark.slow
def test_textworld_games_are_generated_once_per_seed_and_won_by_their_walkthrough(tmp_path):
    config = {"envs": ["tw-treasure_hunter-L1"], "games_dir": str(tmp_path), "splits": {"train": 1, "validation": 1,
                                                                                          "test": 1}}
    env = load_environments({"textworld": config})["textworld"]
    instance = env.create("tw-treasure_hunter-L1/test-0000")
    first = instance.reset()[1].text()
    assert "Valid commands:" in first and ">" not in first.splitlines()[-1]
    before = instance.state_hash()
    walkthrough = list(instance.game.policy_commands)
    results = [instance.step(say(f"Action: {command}")) for command in walkthrough]
    assert results[-1].done and instance.evaluate().score == 1.0 and instance.state_hash() != before
    games = sorted(p.name for p in (tmp_path / "tw-treasure_hunter-L1").iterdir())
    assert games == ["200000.json", "200000.z8"]
    # Another environment object finds the cached game: same seed, same first observation.
    again = load_environments({"textworld": config})["textworld"].create("tw-treasure_hunter-L1/test-0000")
    assert again.reset()[1].text() == first


@pytest.mark.slow
def test_scienceworld_uses_its_own_held_out_variations_and_maps_commands():
    env = load_environments({"scienceworld": {"envs": ["boil"], "splits": SMALL}})["scienceworld"]
    assert env.variations["boil"] == {"train": [0, 1], "validation": [14], "test": [21, 22]}
    instance, results = _play(env, "boil/test-0000",
                              lambda inst, _obs: ["Action: look around", "I want to look around", "fly to the moon"]
                              [min(inst.turns, 2)])
    kinds = [r.info["action_kind"] for r in results[:3]]
    assert kinds == ["exact", "mapped", "invalid"] and instance.evaluate().score == 0.0
    assert len(results) == env.max_turns and instance.state()["seed"] == 21
    instance.close()


@pytest.mark.slow
def test_textworld_games_load_and_play_concurrently_in_one_process(tmp_path):
    # The env service runs instances on worker threads; TextWorld's loader shares parser state across
    # games, and unguarded concurrent loads failed with "pop from empty list" (a 400 on create).
    import threading

    config = {"envs": ["tw-treasure_hunter-L1", "tw-coin_collector-L1"], "games_dir": str(tmp_path),
              "splits": {"train": 1, "validation": 1, "test": 2}}
    env = load_environments({"textworld": config})["textworld"]
    task_ids = env.task_ids("test")
    for task_id in task_ids:  # games are generated once, before the concurrent part
        env.create(task_id)
    errors: list[str] = []
    played: list[str] = []

    def play(task_id: str) -> None:
        try:
            instance = env.create(task_id)
            instance.reset()
            instance.step(say(f"Action: {instance.game.policy_commands[0]}"))
            played.append(task_id)
        except Exception as exc:  # noqa: BLE001 - the test collects every failure to report them together
            errors.append(f"{task_id}: {exc!r}")

    for _ in range(3):
        threads = [threading.Thread(target=play, args=(t,)) for t in task_ids for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == [] and len(played) == 3 * 2 * len(task_ids) == 24


@pytest.mark.slow
def test_textworld_creates_that_build_games_run_concurrently_over_http(tmp_path):
    # Building a game parses the same logic files as loading one. In a fresh env_service, 12 concurrent
    # creates of games not yet built (each builds, then loads) failed 8 times with FailedToken or
    # "pop from empty list" (400s) until building took the same lock as loading and stepping.
    import httpx

    from tests.helpers import run_env_service

    env_yaml = (f"env_service:\n  environments:\n    textworld:\n      games_dir: {tmp_path / 'games'}\n"
                "      envs: [tw-coin_collector-L1, tw-treasure_hunter-L1]\n"
                "      splits: {train: 0, validation: 0, test: 6}\n")

    async def play_all(url: str) -> list[str]:
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            async def play(task_id: str) -> str:
                created = await client.post("/v1/instances", json={"env": "textworld", "task_id": task_id})
                if created.status_code != 201:
                    return f"{task_id}: {created.status_code} {created.text[:200]}"
                instance = created.json()["instance_id"]
                stepped = await client.post(f"/v1/instances/{instance}/step",
                                            json={"action": {"role": "assistant", "content": "look"}})
                await client.delete(f"/v1/instances/{instance}")
                return "" if stepped.status_code == 200 else f"{task_id}: step {stepped.status_code}"

            ids = (await client.get("/v1/environments/textworld/tasks", params={"split": "test"})).json()["task_ids"]
            assert len(ids) == 12
            return [e for e in await asyncio.gather(*(play(t) for t in ids)) if e]

    with run_env_service(env_yaml, tmp_path) as service:
        assert asyncio.run(play_all(service.url)) == []
    assert len(list((tmp_path / "games").glob("*/*.z8"))) == 12
