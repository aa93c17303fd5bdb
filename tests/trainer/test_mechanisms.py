"""A few training steps with every mechanism live over HTTP: task manager, experience manager, judge.

Real services on 127.0.0.1: the env service (flights), the task manager (a short exploration job
synthesizes tasks first), the experience manager (Qdrant local mode) and the judge backed by
`llm_server --model tiny` (random labels, but constrained to the label schema within a budget that holds its
longest answer, so every step parses and the labels flow into ADCA-GRPO). The tiny policy does not solve flights; the test checks that
each mechanism did its part, by the trainer's counters and by the services' own stats.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml

from experience_manager.client import ExperienceClient
from task_manager.client import TaskClient
from tests.helpers import ServiceProcess, run_service
from trainer.config import TrainerConfig
from trainer.local import LocalTrainer

WORKSPACE = "flights_ws"


@pytest.fixture(scope="module")
def flights_env(tmp_path_factory) -> ServiceProcess:
    conf = tmp_path_factory.mktemp("env") / "env.yaml"
    conf.write_text(yaml.safe_dump({"env_service": {"environments": {"flights": {}}}}))
    with run_service("env_service", ["--conf", str(conf)]) as service:
        yield service


@pytest.fixture(scope="module")
def task_manager(flights_env, tmp_path_factory) -> ServiceProcess:
    root = tmp_path_factory.mktemp("tm")
    conf = root / "tm.yaml"
    conf.write_text(yaml.safe_dump({"task_manager": {"env_url": flights_env.url, "store_dir": str(root / "store"),
                                                     "environments": ["flights"],
                                                     "mixture": {"synthetic_ratio": 0.5}}}))
    with run_service("task_manager", ["--conf", str(conf)]) as service:
        async def synthesize() -> dict:
            async with TaskClient(service.url) as client:
                job = await client.submit_job("flights", episodes=12, seed=0)
                return (await client.wait_job(job.job_id, timeout=300)).model_dump()

        job = asyncio.run(synthesize())
        assert job["status"] == "done" and job["progress"]["kept"] > 0, job
        yield service


@pytest.fixture(scope="module")
def experience_manager(tmp_path_factory) -> ServiceProcess:
    store = tmp_path_factory.mktemp("em") / "store"
    with run_service("experience_manager", ["--store", str(store)]) as service:
        async def seed_pool() -> None:
            # One piece of advice about booking flights, so the first step's retrievals can hit.
            async with ExperienceClient(service.url) as client:
                await client.create_workspace(WORKSPACE)
                await client.create_experience(
                    WORKSPACE, "When asked to book or change a flight ticket between two cities",
                    "Search flights for the route and date first, then book the cheapest matching flight id.")

        asyncio.run(seed_pool())
        yield service


@pytest.fixture(scope="module")
def judge(tiny_server, tmp_path_factory) -> ServiceProcess:
    root = tmp_path_factory.mktemp("judge")
    conf = root / "judge.yaml"
    conf.write_text(json.dumps({"judge": {
        "llm": {"base_url": tiny_server.url + "/v1", "model": "tiny", "max_retries": 0, "timeout": 600},
        "audit_log": str(root / "audit.jsonl"), "max_analysis_chars": 0}}))
    with run_service("judge", ["--conf", str(conf)]) as service:
        yield service


def test_a_few_steps_with_every_mechanism_live(flights_env, task_manager, experience_manager, judge, tmp_path):
    out = tmp_path / "run"
    config = TrainerConfig.model_validate({
        "model": "tiny", "seed": 1, "steps": 2, "tasks_per_step": 2, "output_dir": str(out),
        "torch_threads": 1, "progress": False, "tensorboard": False, "plot": False,
        "rollout": {"env": "flights", "n": 2, "max_turns": 2, "max_new_tokens": 4, "max_context": 4096,
                    "experience_ratio": 0.5},
        "optim": {"lr": 1e-3, "minibatches": 2, "micro_batch_size": 2},
        "advantage": {"estimator": "adca_grpo"},
        "services": {"env_url": flights_env.url, "task_url": task_manager.url,
                     "experience_url": experience_manager.url, "judge_url": judge.url},
        "experience": {"workspace": WORKSPACE, "summarize_mode": "heuristic"},
        "tasks": {"synthetic_ratio": 0.5},
        "eval": {"before": True, "after": True, "tasks": 2, "split": "validation"},
        "ray": {"enabled": False},
    })
    result = asyncio.run(LocalTrainer(config).run())
    assert result["steps"] == 2 and result["dropped_groups"] == 0
    mechanisms = result["mechanisms"]

    questioning = mechanisms["self_questioning"]
    assert questioning["tasks_sampled"] == 4
    assert questioning["synthetic_sampled"] >= 1  # half of each batch is synthetic
    assert questioning["synthetic_graded"] == 2 * questioning["synthetic_sampled"]  # n rollouts each
    assert questioning["feedback_tasks"] >= 1
    assert questioning["tasks_kept"] >= 1 and questioning["service"]["pass_rates"]["tracked"] >= 1

    navigating = mechanisms["self_navigating"]
    assert navigating["retrievals"] == 4  # one per task group
    assert navigating["hits"] >= 1 and navigating["injected_rollouts"] >= 1  # round(2 * 0.5) per group
    assert navigating["feedback_items"] == navigating["injected_rollouts"]
    assert navigating["feedback_with_baseline"] == navigating["feedback_items"]
    assert navigating["summarized_trajectories"] == 8
    assert navigating["experiences_created"] >= 1
    assert navigating["pool"]["active"] == 1 + navigating["experiences_created"] and navigating["pool"]["uses"] >= 1

    attributing = mechanisms["self_attributing"]
    assert attributing["trajectories"] == 8 and attributing["steps_labelled"] >= 8
    # The budget is the label schema's worst-case answer, so even the random tiny model's constrained answer
    # is never cut (under the old per-step budget it always was, and every trajectory fell back).
    assert attributing["fallback_rate"] == 0.0 and attributing["parse_rate"] == 1.0
    assert attributing["service"]["budget_cut_calls"] == 0
    assert attributing["service"]["trajectories"] >= 8

    summary = json.loads((out / "summary.json").read_text())
    assert summary["mechanisms"]["self_questioning"]["tasks_sampled"] == 4
    metrics = [row["metric"] for row in summary["eval"]["rows"]]
    assert metrics == ["avg@1", "best@1", "invalid_action_rate"]
    assert all({"before", "after", "delta"} <= set(row) for row in summary["eval"]["rows"])
    assert summary["eval"]["split"] == "validation"
    # The loop's checks are in the file too: every mechanism ran, so none of them reads "off".
    checks = {row["check"]: row for row in summary["checks"]}
    assert checks["synthetic tasks sampled (of tasks)"]["value"].endswith(" of 4")
    assert checks["rollouts with injected experience"]["met"] is True
    assert checks["judge parse rate"]["met"] is True  # the budget fits the schema: every label parses (above)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["judge/steps_labelled"] >= 8 and records[-1]["experience/hits"] >= 1
