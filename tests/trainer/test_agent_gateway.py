"""A user's own agent trained through the gateway (`llm_server --model tiny` over HTTP): merged and unmerged
episodes trained token for token as sampled, a crashing agent failing its episode (never trained), and two
real training steps with a partial-credit grader."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx

from llm_server.client import LLMServerClient
from llm_server.protocol import EpisodeRecord
from tests.helpers import ServiceProcess, run_service
from tests.trainer import gateway_agents
from trainer.agent_trainer import AgentTrainer
from trainer.agents import AgentRunner, command_agent
from trainer.config import TrainerConfig
from trainer.settings import AgentConfig


def _trained_ids(rollout) -> list[int]:
    return [t for s in rollout.segments for t, m in zip(s.response_ids, s.loss_mask, strict=True) if m]


async def test_merged_and_rewritten_episodes_train_exactly_the_sampled_ids(tiny_server: ServiceProcess) -> None:
    config = AgentConfig(callable="tests.trainer.gateway_agents:agent", tasks="unused.jsonl")
    tasks = [{"task_id": "a", "query": "go left"}, {"task_id": "b", "query": "go right"}]
    async with LLMServerClient(tiny_server.url) as gateway:
        merged = AgentRunner(config, gateway, gateway_agents.agent, grader=gateway_agents.share_of_left)
        rewritten = AgentRunner(config, gateway, gateway_agents.rewriting_agent, grader=gateway_agents.share_of_left)
        groups = await merged.collect(tasks, 2) + await rewritten.collect(tasks[:1], 2)
    assert merged.stats.merged == 4 and merged.stats.transitions == 0 and merged.stats.summary()["merge_rate"] == 1
    assert rewritten.stats.transitions == 2 and rewritten.stats.merged == 0
    for rollout in (r for g in groups for r in g):
        record = EpisodeRecord.model_validate(httpx.get(
            f"{tiny_server.url}/v1/episodes/{rollout.trajectory.metadata['episode_id']}", timeout=30).json())
        assert _trained_ids(rollout) == [t for c in record.calls for t in c.token_ids]
        assert [lp for lp, m in zip(rollout.trajectory.logprobs, rollout.trajectory.loss_mask, strict=True)
                if m] == [lp for c in record.calls for lp in c.logprobs]
        assert len(rollout.trajectory.steps) == 3 == len(set(rollout.trajectory.step_ids) - {-1})
        assert rollout.trajectory.outcome in (0.0, 0.5, 1.0)
        assert [m.role for m in rollout.trajectory.messages] == ["system", "user"]  # the judge's task query
        # Merged: one segment whose prompt is the first call's; rewritten: one segment per call, each on its prompt.
        expected = 1 if rollout in [r for g in groups[:2] for r in g] else 3
        assert len(rollout.segments) == expected
        for segment, call in zip(rollout.segments, record.calls, strict=False):
            if expected == 3:
                assert segment.prompt_ids == call.train_prompt_ids and segment.response_ids == call.token_ids


async def test_two_steps_train_and_a_crashing_agent_fails_its_episode(tiny_server: ServiceProcess,
                                                                      tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps(t) for t in [
        {"task_id": "a", "query": "go left"}, {"task_id": "b", "query": "go right"},
        {"task_id": "c", "query": "go up", "crash": True}]) + "\n")
    config = TrainerConfig.model_validate({
        "model": "tiny", "steps": 2, "tasks_per_step": 3, "output_dir": str(tmp_path / "run"),
        "tensorboard": False, "plot": False, "progress": False, "ray": {"enabled": False},
        "rollout": {"env": "agent", "n": 4}, "optim": {"lr": 1e-3},
        "policy": {"kind": "endpoint", "url": tiny_server.url, "served_model": "tiny"}, "services": {},
        "agent": {"callable": "tests.trainer.gateway_agents:crashing_agent", "tasks": str(tasks),
                  "grader": "tests.trainer.gateway_agents:share_of_left"}})
    async with LLMServerClient(tiny_server.url) as llm:
        version = await llm.policy_version()
    result = await AgentTrainer(config).run()
    agent = result["agent"]
    assert agent["failed_episodes"] == 8 and agent["dropped_groups"] == 2
    assert agent["errors"][-1] == "c: RuntimeError: the agent's own bug"
    assert agent["merged"] == 16 and agent["merge_rate"] == 1.0
    history = result["history"]
    assert all(h["rollout/groups"] == 2 for h in history)
    assert any(h["rollout/reward_std"] > 0 for h in history) and all(h["update/grad_norm"] > 0 for h in history)
    async with LLMServerClient(tiny_server.url) as llm:
        assert await llm.policy_version() == version + 2
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["agent"]["merged"] == 16 and summary["training"]["every_step_nonzero_grad"]
    shards = list((tmp_path / "run" / "rollouts").glob("shard-*.jsonl"))
    assert shards and sum(1 for s in shards for _ in s.open()) == 16  # crashed episodes were not recorded


async def test_a_command_agent_and_a_hanging_one(tiny_server: ServiceProcess) -> None:
    config = AgentConfig(command=[sys.executable, "-c", gateway_agents.COMMAND_AGENT], tasks="unused.jsonl",
                         timeout_s=60)
    tasks = [{"task_id": "a", "query": "go left"}, {"task_id": "b", "query": "go right"}]
    async with LLMServerClient(tiny_server.url) as gateway:
        runner = AgentRunner(config, gateway, command_agent(config.command))
        groups = await runner.collect(tasks, 1)
        assert [[r.trajectory.outcome for r in g] for g in groups] == [[0.25], [0.75]]
        assert runner.stats.single_call == 2 and runner.stats.failed_episodes == 0
        hanging = AgentRunner(config.model_copy(update={"timeout_s": 0.5}), gateway, gateway_agents.hanging_agent)
        assert await hanging.collect(tasks[:1], 1) == []
    assert hanging.stats.errors == ["a: timed out after 0.5 s"] and hanging.stats.dropped_groups == 1


async def test_the_judge_labels_each_call_as_a_step(tiny_server: ServiceProcess, tmp_path: Path) -> None:
    """ADCA-GRPO on gateway episodes: the judge service (its LLM the tiny server, JSON by the grammar) labels
    every call of every episode."""
    conf = tmp_path / "judge.yaml"
    conf.write_text(json.dumps({"judge": {
        "llm": {"base_url": f"{tiny_server.url}/v1", "model": "tiny", "max_retries": 0, "timeout": 60},
        "max_output_tokens": 250, "max_steps": 4, "retries": 0, "audit_log": str(tmp_path / "audit.jsonl")}}))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"task_id": "a", "query": "go left"}) + "\n")
    with run_service("judge", ["--conf", str(conf), "--log-level", "WARNING"], timeout=60) as judge:
        config = TrainerConfig.model_validate({
            "model": "tiny", "steps": 1, "tasks_per_step": 1, "output_dir": str(tmp_path / "run"),
            "tensorboard": False, "plot": False, "progress": False, "ray": {"enabled": False},
            "rollout": {"env": "agent", "n": 2}, "advantage": {"estimator": "adca_grpo"},
            "policy": {"kind": "endpoint", "url": tiny_server.url, "served_model": "tiny"},
            "services": {"judge_url": judge.url},
            "agent": {"callable": "tests.trainer.gateway_agents:agent", "tasks": str(tasks),
                      "grader": "tests.trainer.gateway_agents:share_of_left"}})
        result = await AgentTrainer(config).run()
    assert result["mechanisms"]["self_attributing"]["service"] is not None
    (shard,) = (tmp_path / "run" / "rollouts").glob("shard-*.jsonl")
    records = [json.loads(line) for line in shard.open()]
    assert len(records) == 2
    for record in records:
        assert [label["step"] for label in record["labels"]] == [0, 1, 2] == [s["index"] for s in record["steps"]]
