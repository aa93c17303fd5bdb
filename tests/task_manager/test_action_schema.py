"""Self-questioning on environments without tool docs: the gym adapter's discrete actions (its profile's
operations) are the action schema, a text game's are the commands its state lists as `valid_actions`; the
random explorer plays them and hindsight keeps verified goals."""

from __future__ import annotations

import time

import httpx
import pytest

from evolver_launcher.synthesis import SynthesisGate
from task_manager.explore import action_schema, published_actions
from task_manager.profile import EnvProfile
from tests.helpers import run_service

CORRIDOR = "EvolverTest/Corridor-v0"


def test_the_action_schema_is_the_operations_of_the_tasks_own_game():
    profile = EnvProfile.model_validate({"name": "gym", "entities": [
        {"name": "FrozenLake-v1", "opts": [{"name": "left"}, {"name": "down"}]},
        {"name": CORRIDOR, "opts": [{"name": "back"}, {"name": "onward"}]}]})
    assert action_schema(profile, f"{CORRIDOR}/train-0003") == ["back", "onward"]
    assert action_schema(profile, "other-0001") == ["left", "down", "back", "onward"]  # no game of its own: all
    assert action_schema(EnvProfile(name="textgame", entities=[{"name": "w", "opts": []}]), "t-1") == []  # free text


def test_a_state_publishes_the_actions_valid_in_it():
    assert published_actions({"room": "cellar", "valid_actions": ["go north", "", 3, "take coin"]}) == [
        "go north", "take coin"]
    assert published_actions({"room": "cellar"}) == [] and published_actions(None) == []


def synthesize(tmp_path, env_service_yaml: str, env: str, episodes: int) -> tuple[dict, dict]:
    """env_service (configured by `env_service_yaml`) and a task manager with the random explorer and hindsight,
    as processes; one synthesis job on `env`: (its funnel, the kept tasks)."""
    conf = tmp_path / "run.yaml"
    conf.write_text(f"""{env_service_yaml}
task_manager:
  environments: [{env}]
  store_dir: {tmp_path / 'tm'}
  explore: {{explorer: random, breadth_steps: 3, depth_steps: 3}}
  synthesis: {{synthesizer: hindsight, max_goals: 2}}
  dedup: {{embeddings: false}}
""")
    with run_service("env_service", ["--conf", str(conf)]) as env_service, \
            run_service("task_manager", ["--conf", str(conf), "--env-url", env_service.url]) as tm:
        gate = SynthesisGate(tm.url, [env], episodes=episodes, timeout_s=120, say=lambda line: None)
        deadline = time.monotonic() + 150
        while not gate():
            assert time.monotonic() < deadline, "the synthesis job did not finish"
            time.sleep(0.3)
        tasks = httpx.get(f"{tm.url}/v1/tasks", params={"env": env, "synthetic": True}, timeout=30).json()
    return gate.results[env], tasks


@pytest.mark.slow
def test_self_questioning_keeps_verified_tasks_on_a_gym_adapter_environment(tmp_path):
    env_service_yaml = f"""
env_service:
  plugins: {{corridor: tests.env_service.corridor_plugin}}
  environments: {{gym: {{envs: [{CORRIDOR}], splits: {{train: 4, validation: 2, test: 2}}}}}}"""
    funnel, tasks = synthesize(tmp_path, env_service_yaml, "gym", episodes=2)
    assert funnel["episodes_done"] == 2 and funnel["kept"] >= 1, funnel
    # The reference is the actions played; hindsight's query spells them out ("Play onward. Then play back.").
    assert tasks["total"] == funnel["kept"]
    for task in tasks["tasks"]:
        assert task["seed_task_id"].startswith(f"{CORRIDOR}/train-") and task["query"].startswith("Play ")


@pytest.mark.slow
def test_self_questioning_keeps_verified_tasks_on_a_text_game(tmp_path):
    # A two-room TextWorld game, generated offline at the env service's start (a few seconds, no download).
    game = "custom-R2-O2-Q2"
    env_service_yaml = f"""
env_service:
  environments:
    textworld: {{envs: [{game}], pregenerate: true, games_dir: {tmp_path / 'games'},
                splits: {{train: 1, validation: 0, test: 0}}}}"""
    funnel, tasks = synthesize(tmp_path, env_service_yaml, "textworld", episodes=1)
    assert funnel["episodes_done"] == 1 and funnel["verified"] >= 1 and funnel["kept"] >= 1, funnel
    assert tasks["total"] == funnel["kept"]
    # The reference is the admissible commands played; the query spells out the ones that changed the state.
    verbs = {"go", "take", "drop", "put", "insert", "open", "close", "unlock", "lock", "eat"}  # ones that change state
    for task in tasks["tasks"]:
        assert task["seed_task_id"] == f"{game}/train-0000" and task["query"].endswith("."), task
        commands = [c.strip().removeprefix("Then ").lower() for c in task["query"].rstrip(".").split(". ")]
        assert all(c.split()[0] in verbs for c in commands), task["query"]  # "Open basket. Then take key."
