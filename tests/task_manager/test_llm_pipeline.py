"""The whole pipeline with an LLM, over real HTTP: `llm_server` serving SmolLM2 explores and synthesizes.

A 135M model proposes few usable tasks; the test checks that every stage ran and reported its
counts (proposed >= parsed >= verified >= kept), not that the model is good. Kept short: one
episode of three steps, small max_tokens.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from task_manager.client import TaskClient
from tests.helpers import ServiceProcess, run_service
from tests.task_manager.conftest import write_conf

pytestmark = pytest.mark.slow


def test_smollm2_explores_and_synthesizes(flights_env: ServiceProcess, smollm2_server: ServiceProcess,
                                         tmp_path: Path) -> None:
    llm = smollm2_server
    role = {"base_url": f"{llm.url}/v1", "model": "smollm2", "timeout": 300}
    conf = write_conf(tmp_path / "tm.yaml", flights_env.url, tmp_path / "store",
                      llm={"explorer": role, "synthesizer": role},
                      explore={"breadth_steps": 1, "depth_steps": 2, "max_tokens": 40, "concurrency": 1},
                      synthesis={"max_tokens": 160}, dedup={"heldout_splits": []})
    with run_service("task_manager", ["--conf", str(conf)]) as tm:
        async def run() -> dict:
            async with TaskClient(tm.url) as client:
                job = await client.submit_job("flights", episodes=1)
                assert job.params["explorer"] is None  # "auto" resolves to the configured LLM role
                done = await client.wait_job(job.job_id, timeout=400)
                return done.model_dump()

        job = asyncio.run(run())
        log = tm.log()
    progress = job["progress"]
    print(json.dumps({"smollm2_job": progress}))
    # A job that verified nothing ends failed, saying why (docs/services/task_manager.md, "When a job finds nothing").
    if progress["verified"]:
        assert job["status"] == "done", job
    else:
        assert job["status"] == "failed" and "gave no verified task" in job["error"], job
        assert sum(progress["failures"]["by_reason"].values()) == progress["episodes_done"], progress
    assert "explorer llm, synthesizer llm" in log
    assert progress["episodes_done"] == 1 and progress["episode_errors"] == 0
    # Each step is an LLM action sent to a real instance; a reply without a tool call ends the episode early.
    assert 1 <= progress["steps"] <= 3
    assert progress["proposed"] >= progress["parsed"] >= progress["verified"] >= progress["kept"] >= 0
    rejected = sum(progress["rejected"].values())
    assert progress["verified"] + rejected == progress["parsed"]
