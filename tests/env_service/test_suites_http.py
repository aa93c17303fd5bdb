"""The suite adapters and text worlds behind a real env service: the conformance kit passes for each,
the package version and env ids are served (the run manifest records them), and a gymnasium env
that is not built in (registered by a plugin module) and a GEM game are selected by YAML alone and
played to the end through HttpGymEnv and through the AgentEvolver routes."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from env_service.client import HttpGymEnv
from env_service.conformance import run_conformance
from tests.env_service.corridor_plugin import ENV_ID as CORRIDOR
from tests.helpers import ServiceProcess, run_env_service

SUITES = ("gem", "reasoning_gym", "textarena", "textworld", "scienceworld", "babyai")
FAST = {"episodes": 3, "concurrency": 4, "max_steps": 8, "timeout_s": 30.0}
# Each ScienceWorld instance starts its own Java VM: four at once on 2 busy cores took over 30 s to create.
SLOWER = {"scienceworld": {"timeout_s": 90.0}}
GUESS = "game:GuessTheNumber-v0-easy"

YAML = f"""
env_service:
  plugins:
    corridor: tests.env_service.corridor_plugin
  environments:
    gym: {{envs: ["{CORRIDOR}"], splits: {{train: 2, validation: 1, test: 1}}}}
    gem: {{envs: ["{GUESS}"], splits: {{train: 2, validation: 1, test: 1}}}}
    reasoning_gym: {{envs: [basic_arithmetic], splits: {{train: 2, validation: 1, test: 1}}}}
    textarena: {{envs: [GuessTheNumber-v0], splits: {{train: 2, validation: 1, test: 1}}}}
    textworld: {{envs: [tw-coin_collector-L1], pregenerate: true, games_dir: GAMES,
                splits: {{train: 1, validation: 1, test: 1}}}}
    scienceworld: {{envs: [find-living-thing], splits: {{train: 2, validation: 1, test: 1}}}}
    babyai: {{envs: [BabyAI-GoToRedBallNoDists-v0], splits: {{train: 2, validation: 1, test: 1}}}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    directory = tmp_path_factory.mktemp("suites")
    with run_env_service(YAML.replace("GAMES", str(directory / "games")), directory) as service:
        yield service


@pytest.mark.slow
@pytest.mark.parametrize("env", SUITES)
async def test_each_suite_conforms_over_http(server, env):
    report = await run_conformance(server.url, env, **{**FAST, **SLOWER.get(env, {})})
    assert report.ok, report.render()
    assert {"v1.step_shape", "ae.step_shape", "episodes", "concurrency"} <= set(report.checks)
    assert "live 0 -> 0" in report.checks["leak"].detail


def test_package_versions_and_env_ids_are_served_for_the_manifest(server):
    served = {e["name"]: e for e in httpx.get(f"{server.url}/v1/environments", timeout=30).json()["environments"]}
    assert set(SUITES) | {"gym"} == set(served)
    info = httpx.get(f"{server.url}/v1/environments/gem", timeout=30).json()["info"]
    assert info["package"]["name"] == "gem-llm" and info["package"]["version"] and info["env_ids"] == [GUESS]
    assert httpx.get(f"{server.url}/v1/environments/gym", timeout=30).json()["info"]["games"] == [CORRIDOR]


def test_a_plugin_registered_gymnasium_env_plays_to_the_goal_through_httpgymenv(server):
    env = HttpGymEnv(server.url, "gym", f"{CORRIDOR}/test-0000")
    try:
        assert env.native and env.action_names == ["back", "onward"]
        observation, _ = env.reset(seed=0)
        assert observation == 0
        steps, terminated = 0, False
        while not terminated:
            observation, reward, terminated, truncated, _ = env.step(1)
            steps += 1
        assert (observation, reward, steps) == (3, 1.0, 3) and env.evaluate() == 1.0
    finally:
        env.close()


def _bisect_replies():
    low, high, guess = 1, 10, None
    observation = yield
    while True:
        if guess is not None and "higher" in observation:
            low = guess + 1
        elif guess is not None and "lower" in observation:
            high = guess - 1
        guess = (low + high) // 2
        observation = yield f"My guess is \\boxed{{{guess}}}"


def test_a_gem_game_is_won_through_httpgymenv_in_text_mode(server):
    env = HttpGymEnv(server.url, "gem", f"{GUESS}/test-0000")
    try:
        assert not env.native
        observation, info = env.reset()
        assert [m["role"] for m in info["messages"]] == ["system", "user"] and "Guess The Number" in observation
        player = _bisect_replies()
        next(player)
        reward, terminated, turns = 0.0, False, 0
        while not terminated:
            observation, reward, terminated, truncated, info = env.step(player.send(observation))
            turns += 1
            assert info["action_kind"] == "exact"
        assert reward == 1.0 and env.evaluate() == 1.0 and turns <= 4
    finally:
        env.close()


def test_a_gem_game_and_the_plugin_env_run_full_episodes_through_the_agentevolver_routes(server):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for env_type, task_id, replies in ((("gem", f"{GUESS}/test-0000", None)),
                                          ("gym", f"{CORRIDOR}/train-0001", iter(["Action: onward"] * 3))):
            tasks = http.post("/get_env_profile", json={"env_type": env_type, "params": {"split": "test"}}).json()
            assert tasks["success"] and len(tasks["data"]) == 1
            created = http.post("/create", json={"env_type": env_type, "task_id": task_id}).json()
            assert created["success"], created
            instance_id = created["data"]["info"]["instance_id"]
            observation = created["data"]["state"][-1]["content"]
            player = _bisect_replies()
            next(player)
            done, turns = False, 0
            while not done:
                reply = next(replies) if replies is not None else player.send(observation)
                step = http.post("/step", json={"instance_id": instance_id,
                                                "messages": {"role": "assistant", "content": reply}}).json()
                assert step["success"], step
                observation, done = step["data"]["state"][0]["content"], step["data"]["is_terminated"]
                turns += 1
            assert turns <= 4
            assert http.post("/evaluate", json={"instance_id": instance_id}).json() == {"success": True, "data": 1.0}
            assert http.post("/release", json={"instance_id": instance_id}).json()["success"] is True


def test_bad_requests_get_4xx_naming_what_to_fix(server):
    bad = httpx.post(f"{server.url}/v1/instances", json={"env": "gem", "task_id": "game:Wordle-v0-easy/test-0000"},
                     timeout=30)
    assert bad.status_code == 404 and "has no task" in bad.json()["error"]["message"]
    bad = httpx.post(f"{server.url}/v1/instances", json={"env": "babyai", "task_id":
                     "BabyAI-GoToRedBallNoDists-v0/test-0000", "params": {"seed": "x"}}, timeout=30)
    assert 400 <= bad.status_code < 500 and "params.seed" in bad.json()["error"]["message"]
