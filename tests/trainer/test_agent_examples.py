"""The examples in `examples/agents/` run unchanged against the gateway (`llm_server --model tiny`) on flights
v2 tier-1 tasks through a real env_service: the plain `openai` SDK loop (its multi-call episodes merge), and the
LangGraph ReAct agent trained two steps with a partial-credit grader."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from examples.agents import openai_flights
from llm_server.client import LLMServerClient
from tests.helpers import ServiceProcess, run_env_service
from trainer.agent_trainer import AgentTrainer
from trainer.agents import AgentRunner
from trainer.config import TrainerConfig
from trainer.peers import EnvPeer
from trainer.settings import AgentConfig

FLIGHTS = {"version": 2, "tiers": [1], "splits": {"train": 8, "validation": 4, "test": 4}}


@pytest.fixture(scope="module")
def flights(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    env_yaml = yaml.safe_dump({"env_service": {"environments": {"flights": FLIGHTS}}})
    with run_env_service(env_yaml, tmp_path_factory.mktemp("flights")) as service:
        yield service


async def test_the_openai_sdk_example_runs_through_the_gateway(tiny_server: ServiceProcess,
                                                               flights: ServiceProcess) -> None:
    config = AgentConfig(callable="examples.agents.openai_flights:agent", tasks="unused.jsonl", env="flights")
    # A random model calls no tool unless made to, and a forced call's random string arguments rarely close
    # within max_tokens: the episodes are mostly one call here (SmolLM2 makes real multi-call ones, below).
    agent = functools.partial(openai_flights.agent, tool_choice="required", max_turns=3, max_tokens=48)
    env = EnvPeer(flights.url)
    try:
        async with LLMServerClient(tiny_server.url) as gateway:
            runner = AgentRunner(config, gateway, agent, env=env, env_url=flights.url)
            groups = await runner.collect([{"task_id": "test-t1-0000"}, {"task_id": "test-t1-0001"}], 2)
    finally:
        await env.aclose()
    summary = runner.stats.summary()
    assert len(groups) == 2 and summary["failed_episodes"] == 0 and summary["calls"] >= 4, summary
    for rollout in (r for g in groups for r in g):
        assert rollout.trajectory.outcome == 0.0  # graded by the desk: a random model solves nothing
        assert rollout.trajectory.env_type == "flights" and rollout.trajectory.steps


async def test_the_langgraph_example_trains_two_steps(tiny_server: ServiceProcess, flights: ServiceProcess,
                                                       tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"train-t1-000{i}"}) + "\n" for i in range(2)))
    config = TrainerConfig.model_validate({
        "model": "tiny", "steps": 2, "tasks_per_step": 2, "output_dir": str(tmp_path / "run"), "tensorboard": False,
        "plot": False, "progress": False, "ray": {"enabled": False}, "rollout": {"env": "flights", "n": 4},
        "optim": {"lr": 1e-3}, "policy": {"kind": "endpoint", "url": tiny_server.url, "served_model": "tiny"},
        "services": {"env_url": flights.url}, "eval": {"before": False, "after": False},
        "agent": {"callable": "examples.agents.langgraph_flights:agent", "tasks": str(tasks), "env": "flights",
                  "grader": "tests.trainer.gateway_agents:words_credit", "timeout_s": 120}})
    result = await AgentTrainer(config).run()
    assert result["agent"]["failed_episodes"] == 0, result["agent"]["errors"]
    history = result["history"]
    assert len(history) == 2 and all(h["rollout/groups"] == 2 for h in history)
    assert all(h["rollout/reward_std"] > 0 for h in history), [h["rollout/reward_std"] for h in history]
    assert all(h["update/grad_norm"] > 0 for h in history), [h["update/grad_norm"] for h in history]


async def test_the_flights_agent_is_evaluated_on_the_environments_held_out_split(
        tiny_server: ServiceProcess, flights: ServiceProcess, tmp_path: Path) -> None:
    """With `agent.env`, the held-out tasks are the first eval.tasks ids of the environment's eval.split, each
    given to the agent as a training task of the environment is, and graded by the desk's evaluate."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"task_id": "train-t1-0000"}) + "\n")
    config = TrainerConfig.model_validate({
        "model": "tiny", "steps": 1, "tasks_per_step": 1, "output_dir": str(tmp_path / "run"), "tensorboard": False,
        "plot": False, "progress": False, "ray": {"enabled": False}, "rollout": {"env": "flights", "n": 2},
        "optim": {"lr": 1e-3}, "policy": {"kind": "endpoint", "url": tiny_server.url, "served_model": "tiny"},
        "services": {"env_url": flights.url}, "eval": {"split": "test", "tasks": 2, "k": 2, "greedy": False},
        "agent": {"callable": "tests.trainer.gateway_agents:short_flights_agent", "tasks": str(tasks),
                  "env": "flights", "timeout_s": 120}})
    result = await AgentTrainer(config).run()
    ev, report = result["eval"], result["agent"]["eval"]
    assert report["source"] == "flights test split" and report["failed_episodes"] == 0, report["errors"]
    assert report["temperature"] == 1.0 and report["episodes"] == 8  # sampled at rollout.temperature
    assert ev["split"] == "test" and ev["k"] == 2
    for label in ("before", "after"):
        assert ev["per_task"][label]["outcomes"] == {"test-t1-0000": [0.0, 0.0], "test-t1-0001": [0.0, 0.0]}
    index = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "index.jsonl").open()]
    assert [r["task_id"] for r in index] == ["train-t1-0000"] * 2
