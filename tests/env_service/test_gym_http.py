"""gymnasium, both ways: check_env on HttpGymEnv over a real server, and text-mode episodes."""

from __future__ import annotations

import warnings

import pytest
from gymnasium.utils.env_checker import check_env

from env_service.client import HttpGymEnv
from tests.env_service.service_support import env_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with env_server(tmp_path_factory.mktemp("gym")) as service:
        yield service


def test_check_env_passes_on_frozenlake_over_http(server):
    env = HttpGymEnv(server.url, "gym", "FrozenLake-v1/train-0000", render_mode="ansi")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "no spec" warnings; failures are assertions
            check_env(env)
        assert env.observation_space.n == 16 and env.action_space.n == 4
        obs, info = env.reset(seed=3)
        assert obs == 0 and "@" in env.render()
        total_steps = 0
        terminated = truncated = False
        while not (terminated or truncated):
            obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
            total_steps += 1
        assert env.evaluate() == (1.0 if reward > 0 else 0.0)
        assert total_steps <= 100
    finally:
        env.close()


def test_seeded_reset_reproduces_a_slippery_episode(server):
    env = HttpGymEnv(server.url, "gym", "FrozenLake-v1/train-0000")
    try:
        runs = []
        for _ in range(2):
            env.reset(seed=11)
            runs.append([env.step(2)[0] for _ in range(5)])
        assert runs[0] == runs[1]
        # The largest seed JSON carries round-trips (the state read back included); one more is refused here.
        observation, _ = env.reset(seed=2**64 - 1)
        assert env.observation_space.contains(observation)
        with pytest.raises(ValueError, match="seed must be in"):
            env.reset(seed=2**64)
    finally:
        env.close()


def test_text_mode_over_flights(server):
    env = HttpGymEnv(server.url, "flights", "train-0000")
    try:
        obs, info = env.reset(seed=0)
        assert "cheapest" in obs and [m["role"] for m in info["messages"]] == ["system", "user"]
        obs, reward, terminated, truncated, _ = env.step("get_passenger(name='Elif Silva')")
        assert '"passenger_id"' in obs and not terminated
        obs, reward, terminated, truncated, _ = env.step("Nothing more to do.")
        assert terminated and reward == 0.0
    finally:
        env.close()
