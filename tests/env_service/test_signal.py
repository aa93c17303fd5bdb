"""`signal` over HTTP: the classic cue task and the lookup mode the learning benchmark uses."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from common.config import ConfigError
from common.schemas import ChatMessage
from env_service.client import EnvClient
from env_service.environments.signal import SignalEnvironment
from tests.helpers import run_env_service

OPTIONS = ["north", "south", "east", "west", "up", "down", "left", "right"]
LABELS = ["wind", "road", "river", "bird", "cloud", "signal", "flag", "smoke"]
ENV_YAML = f"""
env_service:
  environments:
    signal:
      options: {OPTIONS}
      labels: {LABELS}
      fields: 4
"""


@pytest.fixture(scope="module")
def env_url(tmp_path_factory):
    with run_env_service(ENV_YAML, tmp_path_factory.mktemp("signal")) as service:
        yield service.url


async def play(client: EnvClient, task_id: str, pick) -> tuple[str, str, float]:
    """Reset, look, answer pick(query, readings); return the query, the readings and the score."""
    created = await client.create("signal", task_id)
    try:
        query = created.messages[-1].content
        readings = (await client.step(created.instance_id, "Show me.")).observation.content
        await client.step(created.instance_id, pick(query, readings))
        return query, readings, (await client.evaluate(created.instance_id)).score
    finally:
        await client.release(created.instance_id)


def parse_readings(readings: str) -> dict[str, str]:
    return {label.lower(): word for label, word in re.findall(r"([A-Z][a-z]+): ([a-z]+)\.", readings)}


def asked_label(query: str) -> str:
    return re.search(r"does the (\w+) point", query).group(1)


async def test_lookup_scores_the_asked_reading_and_nothing_else(env_url):
    async with EnvClient(env_url) as client:
        task_ids = (await client.task_ids("signal", "test"))[:16]
        for task_id in task_ids:
            query, readings, score = await play(client, task_id, lambda q, r: f"It points {parse_readings(r)[asked_label(q)]}.")
            shown = parse_readings(readings)
            assert len(shown) == 4 and len(set(shown.values())) == 4, readings
            assert asked_label(query) in shown and score == 1.0
            # The first reading is the wrong answer unless it is the asked one: position alone does not score.
            first_label = next(iter(shown))
            _, _, first_score = await play(client, task_id, lambda q, r: next(iter(parse_readings(r).values())))
            assert first_score == float(first_label == asked_label(query))


async def test_held_out_lookup_tasks_are_distinct_prompts(env_url):
    async with EnvClient(env_url) as client:
        prompts = []
        for task_id in await client.task_ids("signal", "test"):
            query, readings, _ = await play(client, task_id, lambda q, r: "no idea")
            prompts.append((query, readings))
    assert len(prompts) == 64 and len(set(prompts)) == 64


def test_lookup_balances_signals_and_asked_labels():
    env = SignalEnvironment({"options": OPTIONS, "labels": LABELS, "fields": 4})
    tasks = [env._tasks[t] for t in env.task_ids("test")]
    assert set(Counter(t.signal for t in tasks).values()) == {8}
    assert set(Counter(t.label for t in tasks).values()) == {8}
    assert env.profile()["background"].startswith("Read the reading")


def test_classic_mode_keeps_its_wording():
    env = SignalEnvironment({"options": ["north", "south"]})
    instance = env.create(env.task_ids("train")[0])
    assert instance.reset()[1].content == "Look at the signal, then answer with its word: north, south."
    assert instance.step(ChatMessage(role="assistant", content="hello")).observation.content == f"Answer now. The signal is {instance.signal}"


@pytest.mark.parametrize(("config", "message"), [
    ({"labels": LABELS[:3], "fields": 4}, "fields=4 needs at least that many labels (3)"),
    ({"labels": LABELS, "query": "Answer: {choices}"}, "needs a query containing {label}"),
    ({"labels": ["Wind", "wind"]}, "labels must be distinct lowercase words"),
    ({"cue": "no placeholder"}, "cue must contain {signal}"),
])
def test_bad_lookup_config_names_what_to_fix(config, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        SignalEnvironment(config)


@pytest.mark.parametrize("lookup", [False, True])
def test_one_turn_mode_shows_the_cue_in_the_question_and_scores_the_first_answer(lookup):
    config = {"options": OPTIONS, "turns": 1, **({"labels": LABELS} if lookup else {})}
    env = SignalEnvironment(config)
    right, wrong = env.create(env.task_ids("test")[0]), env.create(env.task_ids("test")[0])
    system, question = right.reset()
    assert "First" not in system.content and "first" not in question.content  # nothing to look at first
    if lookup:
        shown = parse_readings(question.content)
        assert len(shown) == 4 and shown[asked_label(question.content)] == right.signal
    else:
        assert question.content.endswith(f"The signal is {right.signal}")
    result = right.step(ChatMessage(role="assistant", content=right.signal))
    assert result.done and result.reward == 1.0 and right.evaluate().score == 1.0
    other = next(o for o in OPTIONS if o != wrong.signal)
    result = wrong.step(ChatMessage(role="assistant", content=other))
    assert result.done and result.reward == 0.0 and wrong.evaluate().info["turns"] == 1
    assert wrong.step(ChatMessage(role="assistant", content=wrong.signal)).info == {"error": "episode already finished"}
    assert wrong.evaluate().score == 0.0  # a late second answer changes nothing


def test_bad_turns_names_the_key():
    with pytest.raises(ConfigError, match="turns"):
        SignalEnvironment({"turns": 3})
