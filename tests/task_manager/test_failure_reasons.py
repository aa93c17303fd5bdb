"""Self-questioning says why it found nothing: each exploration's failure reason is counted (job progress,
/v1/stats), a job that found nothing ends failed with the reasons and the first error, the launcher's gate
stops on it unless `allow_no_tasks`, and a kind the profile cannot give is refused at the job's start. And
what it finds for a new user's plugin: the scaffold's read-only tool gives verified question tasks.
Real env service (the library desk plugins of tests/env_service/library_desk.py, the scaffold's plugin) and
task managers over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import yaml

from evolver_launcher.synthesis import SynthesisFailed, SynthesisGate, _no_task_line
from task_manager.client import TaskClient
from task_manager.protocol import Failures
from tests.helpers import ServiceProcess, plugin_env_service, run_service

DESK = "tests.env_service.library_desk"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    plugins = {"library_desk": f"{DESK}:LibraryDesk", "dict_content": f"{DESK}:DictContent"}
    environments = {"library_desk": {}, "dict_content": {}, "signal": {},
                    "shelves": {"tasks_per_split": 16, "fallback_moves": True}}  # as its run.yaml
    with plugin_env_service(tmp_path_factory.mktemp("env"), plugins, environments) as service:
        yield service


def task_manager(env: ServiceProcess, folder, environments: list[str], kinds: list[str]):
    conf = folder / "tm.yaml"
    conf.write_text(yaml.safe_dump({"task_manager": {
        "env_url": env.url, "store_dir": str(folder / "store"), "environments": environments,
        "synthesis": {"synthesizer": "hindsight", "kinds": kinds}, "dedup": {"embeddings": False}}}))
    return run_service("task_manager", ["--conf", str(conf)])


async def finished(client: TaskClient, job_id: str):
    return await client.wait_job(job_id, timeout=60, poll=0.1)


async def test_a_job_that_found_nothing_fails_with_its_reasons_and_the_gate_says_so(env, tmp_path):
    with task_manager(env, tmp_path, ["dict_content", "library_desk"], ["goal"]) as tm:
        async with TaskClient(tm.url) as client:
            # Every step of dict_content ends in an environment error (its observation content is a dict).
            job = await client.submit_job("dict_content", episodes=2, breadth_steps=2, depth_steps=0)
            broken = await finished(client, job.job_id)
            assert broken.status == "failed"
            failures = Failures.model_validate(broken.progress["failures"])
            assert failures.by_reason == {"environment_error": 2}
            assert "ValidationError" in failures.first_error and "content" in failures.first_error
            assert broken.error.startswith("every exploration failed (2 episodes): environment_error: 2; first "
                                           "error: ") and "ValidationError" in broken.error

            # One look-up per episode on the working desk: it reads, never reserves: no state to make a goal of.
            job = await client.submit_job("library_desk", episodes=2, breadth_steps=1, depth_steps=0, seed=3)
            empty = await finished(client, job.job_id)
            assert empty.status == "failed", empty
            assert empty.progress["failures"]["by_reason"] == {"no_state_change": 2}
            assert "2 explorations gave no verified task (0 proposed): no_state_change: 2" in empty.error

            stats = await client.stats()
            assert stats["failures"]["by_reason"] == {"environment_error": 2, "no_state_change": 2}

        said: list[str] = []
        gate = SynthesisGate(tm.url, ["dict_content"], episodes=1, timeout_s=60, say=said.append)
        with pytest.raises(SynthesisFailed, match=r"ended failed: every exploration failed .*ValidationError"):
            await asyncio.to_thread(gate.run)  # the gate runs its own event loop, as in the launcher
        lenient = SynthesisGate(tm.url, ["dict_content"], episodes=1, timeout_s=60, say=said.append,
                                allow_no_tasks=True)
        assert (await asyncio.to_thread(lenient.run))["dict_content"]["failures"]["by_reason"] == {"environment_error": 1}
        assert "training on its own tasks only (launcher.synthesis.allow_no_tasks)" in said[-1]


async def test_asking_for_lookups_of_a_profile_without_lookups_is_refused_at_the_jobs_start(env, tmp_path):
    with task_manager(env, tmp_path, ["signal"], ["goal", "lookup"]) as tm:
        async with TaskClient(tm.url) as client:
            job = await client.submit_job("signal", episodes=3)
            info = await finished(client, job.job_id)
    assert info.status == "failed" and info.progress["episodes_done"] == 0
    assert "the profile of 'signal' has no `lookups` section" in info.error
    assert "entities[].opts[].lookups" in info.error


async def test_the_scaffolds_read_only_tool_gives_verified_question_tasks(env, tmp_path):
    """The scaffold writes a `lookups` section for its read-only tool (`look`); its run.yaml asks for
    kinds [goal, lookup]: self-questioning then writes questions answered in text, verified by replay."""
    with task_manager(env, tmp_path, ["shelves"], ["goal", "lookup"]) as tm:
        async with TaskClient(tm.url) as client:
            job = await client.submit_job("shelves", episodes=2)
            info = await finished(client, job.job_id)
            assert info.status == "done", info
            questions = {kind: row for kind, row in info.progress["by_kind"].items()
                         if kind.startswith("shelf_lookup:")}
            assert questions and sum(row["verified"] for row in questions.values()) >= 1, info.progress
            page = await client.list_tasks(env="shelves", synthetic=True)
    asked = [t.query or "" for t in page.tasks if t.metadata.get("kind") == "lookup"]
    assert asked and all(q.startswith("Which shelf is the ") and q.endswith(" on?") for q in asked), page


def test_failures_count_by_reason_keep_the_first_error_and_read_as_one_line():
    failures = Failures()
    failures.add("no_state_change")
    failures.add("environment_error", "IndexError: list index out of range (at desk.py:3 in step)")
    other = Failures(by_reason={"environment_error": 2}, first_error="KeyError: 'x'")
    failures.merge(other)
    assert failures.by_reason == {"no_state_change": 1, "environment_error": 3} and failures.total() == 4
    assert failures.summary() == ("environment_error: 3, no_state_change: 1; first error: IndexError: list index "
                                  "out of range (at desk.py:3 in step)")
    assert Failures().summary() == "" and Failures.model_validate(failures.model_dump()) == failures
    # The launcher's line after a job that found something, as `progress` carries it.
    assert _no_task_line({"failures": failures.model_dump()}).startswith("; episodes with no task: environment_error: 3")
    assert _no_task_line({}) == ""
