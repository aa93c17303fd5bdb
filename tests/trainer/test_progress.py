"""Live progress of a training step: one event per finished rollout (failed attempts are not counted)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from common.schemas import Task
from engine.models import load_model
from tests.helpers import run_env_service
from trainer.peers import EnvPeer
from trainer.policy import InProcessPolicy
from trainer.rollout import Rollout, RolloutConfig, collect_groups

ENV_YAML = "env_service:\n  environments:\n    signal: {fallback: first_char}\n"


@pytest.fixture(scope="module")
def env_url(tmp_path_factory):
    with run_env_service(ENV_YAML, tmp_path_factory.mktemp("env")) as service:
        yield service.url


def test_one_event_per_rollout_and_none_for_failed_attempts(env_url):
    torch.set_num_threads(1)
    model, tok = load_model("tiny")
    policy = InProcessPolicy(model, tok, max_batch=16, threads=1)
    failures = {"left": 2}

    async def flaky(prompt_ids, sampling):
        if failures["left"] > 0:  # the first two attempts fail, then their retries succeed
            failures["left"] -= 1
            raise RuntimeError("injected generation failure")
        return await policy.generate(prompt_ids, sampling)

    events: list[Rollout] = []

    async def go():
        env = EnvPeer(env_url)
        try:
            tasks = [Task(task_id=f"signal-train-{i:04d}", env_type="signal") for i in range(3)]
            config = RolloutConfig(env="signal", n=2, max_turns=2, max_new_tokens=3, max_context=256, retries=1)
            return await collect_groups(tasks, env, flaky, tok, config, seed=0, on_rollout=events.append)
        finally:
            await env.aclose()
            await policy.aclose()

    groups = asyncio.run(go())
    rollouts = [r for g in groups for r in g]
    assert len(rollouts) == 6 and len(events) == 6
    assert {id(r) for r in events} == {id(r) for r in rollouts}
