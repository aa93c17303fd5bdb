"""Held-out evaluation of a user's own agent (`trainer.eval` in an agent run) on `llm_server --model tiny` over
HTTP: the agent itself plays k episodes per held-out task before and after training, graded like its training
episodes, never recorded as rollouts; a crash counts 0 with its error in the summary; the summary's evaluation has
an in-loop run's shape (the science scripts' per-task metric and the studio read it); and the gateway forces the
evaluation's sampling on every call, whatever the agent asks for."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from benchmarks.science.ablation_common import paired, per_task_metric, summary_evaluation
from llm_server.protocol import EpisodeRecord
from studio.app import build_app
from studio.settings import StudioSettings
from tests.helpers import InProcessServer, ServiceProcess
from trainer.agent_trainer import AgentTrainer
from trainer.config import TrainerConfig

TRAIN = [{"task_id": "a", "query": "go left"}, {"task_id": "b", "query": "go right"}]
HELD_OUT = [{"task_id": "held-1", "query": "go left twice"}, {"task_id": "held-2", "query": "go right twice"},
            {"task_id": "held-crash", "query": "go up", "crash": True}]


def _jsonl(path: Path, tasks: list[dict]) -> str:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return str(path)


def _config(tiny_server: ServiceProcess, tmp_path: Path, **agent: object) -> TrainerConfig:
    return TrainerConfig.model_validate({
        "model": "tiny", "steps": 1, "tasks_per_step": 2, "output_dir": str(tmp_path / "runs" / "agent"),
        "tensorboard": False, "plot": False, "progress": False, "ray": {"enabled": False},
        "rollout": {"env": "agent", "n": 2}, "optim": {"lr": 1e-3},
        "eval": {"before": True, "after": True, "k": 2, "greedy": True},
        "policy": {"kind": "endpoint", "url": tiny_server.url, "served_model": "tiny"}, "services": {},
        "agent": {"callable": "tests.trainer.gateway_agents:crashing_agent", "tasks": _jsonl(tmp_path / "train.jsonl",
                                                                                            TRAIN),
                  "grader": "tests.trainer.gateway_agents:share_of_left", **agent}})


async def test_the_agent_is_evaluated_on_held_out_tasks_before_and_after(tiny_server: ServiceProcess,
                                                                         tmp_path: Path) -> None:
    config = _config(tiny_server, tmp_path, eval_tasks=_jsonl(tmp_path / "held.jsonl", HELD_OUT))
    result = await AgentTrainer(config).run()
    summary = json.loads((tmp_path / "runs" / "agent" / "summary.json").read_text())
    ev = summary["eval"]
    held_ids = [t["task_id"] for t in HELD_OUT]
    assert ev["tasks"] == 3 and ev["k"] == 2 and [r["metric"] for r in ev["rows"]] == [
        "avg@2", "best@2", "invalid_action_rate"]
    for label in ("before", "after"):
        outcomes = ev["per_task"][label]["outcomes"]
        assert list(outcomes) == held_ids and all(len(v) == 2 for v in outcomes.values())
        assert outcomes["held-crash"] == [0.0, 0.0]
        # Greedy: the gateway forced temperature 0 on every call, so both samples of a task are one episode.
        assert all(v[0] == v[1] for v in outcomes.values()), outcomes
        assert all(len(set(called)) == 1 for called in ev["per_task"][label]["called"].values())
    assert ev["rows"][0]["delta"]["n"] == 3
    report = summary["agent"]["eval"]
    assert report["episodes"] == 12 and report["failed_episodes"] == 4 and report["temperature"] == 0.0
    assert report["errors"] == ["held-crash: RuntimeError: the agent's own bug"] * 4
    assert report["evaluations"] == ["before", "after"]
    # The training episodes are the RL ones only: no held-out task is a rollout, none failed.
    assert result["agent"]["episodes"] == 4 and result["agent"]["failed_episodes"] == 0
    index = [json.loads(line) for line in (tmp_path / "runs" / "agent" / "rollouts" / "index.jsonl").open()]
    assert len(index) == 4 and {r["task_id"] for r in index} == {"a", "b"}
    assert [h["step"] for h in result["history"]] == [0, 1] and "eval/avg@2" in result["history"][1]

    # The science scripts read it as an in-loop evaluation: per-task strict avg, paired before -> after.
    before, after = (summary_evaluation(summary, label) for label in ("before", "after"))
    assert per_task_metric(after, "avg")["held-crash"] == 0.0
    assert len(paired(before, after, "avg", require_call=True)) == 3
    with InProcessServer(build_app(StudioSettings(runs=str(tmp_path / "runs")), token="")) as server:
        page = httpx.get(f"{server.url}/runs/agent", timeout=30).text
    assert '<table class="eval">' in page and "avg@2" in page


async def test_held_out_tasks_that_are_training_tasks_are_refused(tiny_server: ServiceProcess,
                                                                  tmp_path: Path) -> None:
    config = _config(tiny_server, tmp_path, eval_tasks=_jsonl(tmp_path / "held.jsonl", TRAIN[:1] + HELD_OUT[:1]))
    with pytest.raises(ValueError, match="held-out tasks of agent.eval_tasks .* are training tasks of agent.tasks"):
        await AgentTrainer(config).run()


def test_the_gateway_forces_an_episodes_sampling_whatever_the_agent_asks(tiny_server: ServiceProcess) -> None:
    """The same forced temperature and seed give the same reply to calls that ask for other ones."""
    replies = []
    for asked_seed in (1, 2):
        opened = httpx.post(f"{tiny_server.url}/v1/episodes", json={"sampling": {"temperature": 1.0, "seed": 5}},
                            timeout=30).json()
        client = openai.OpenAI(base_url=f"{tiny_server.url}/v1/episodes/{opened['episode_id']}", api_key="unused",
                               max_retries=0)
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=12, temperature=0.3, seed=asked_seed)
        replies.append(reply.choices[0].message.content)
        record = EpisodeRecord.model_validate(
            httpx.post(f"{tiny_server.url}/v1/episodes/{opened['episode_id']}/end", timeout=30).json())
        assert record.sampling is not None and record.sampling.seed == 5 and record.mode == "policy"
    assert replies[0] == replies[1]
    bad = httpx.post(f"{tiny_server.url}/v1/episodes", json={"sampling": {"temperature": -1}}, timeout=30)
    assert bad.status_code == 422 and "sampling" in bad.text
