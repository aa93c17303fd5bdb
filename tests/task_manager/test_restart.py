"""Restart: SIGKILL the service at a deterministic point of a synthesis job; the job resumes, nothing doubles.

The fault hook (EVOLVER_TM_FAULT, off by default) kills the process inside an episode's commit (its
tasks and exploration written into the open transaction, the cursor not yet), then, after a restart,
before another episode's commit. After each restart on the same store, the job continues at its cursor
and ends with exactly the tasks an uninterrupted run of the same job produces: a store that wrote an
episode's rows outside one transaction would keep half an episode and fail here.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from common.faults import DISK_FULL_ENV
from tests.helpers import ServiceProcess, run_service
from tests.task_manager.conftest import stored_rows, write_conf

pytestmark = pytest.mark.slow

EPISODES, KILL_INSIDE, KILL_BEFORE = 10, 4, 7
JOB = {"env": "flights", "episodes": EPISODES, "seed": 11}


def _wait_done(url: str, job_id: str, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()
        if job["status"] in ("done", "failed", "cancelled"):
            return job
        time.sleep(0.3)
    raise TimeoutError(job)


def _conf(root: Path, env: ServiceProcess, name: str) -> tuple[Path, Path]:
    store = root / name
    # Two episodes at a time: the killed episode shares its chunk with a committed one. Embeddings
    # are off here (the dedup test is elsewhere): three MiniLM loads would triple the test's time.
    return write_conf(root / f"{name}.yaml", env.url, store, explore={"concurrency": 2},
                      dedup={"heldout_splits": [], "embeddings": False}), store


def test_killed_job_resumes_without_duplicates(flights_env: ServiceProcess, tmp_path: Path) -> None:
    conf, store = _conf(tmp_path, flights_env, "crashed")
    with run_service("task_manager", ["--conf", str(conf)],
                     env={"EVOLVER_TM_FAULT": f"kill_inside_commit:{KILL_INSIDE}"}) as service:
        job_id = httpx.post(f"{service.url}/v1/jobs", json=JOB, timeout=30).json()["job_id"]
        assert service.proc.wait(timeout=240) == -9, service.log()[-2000:]
        assert f"fault injection: kill_inside_commit at episode {KILL_INSIDE}" in service.log()
    [job] = stored_rows(store, "SELECT status, cursor FROM jobs")
    assert (job["status"], job["cursor"]) == ("running", KILL_INSIDE)
    before = {r["task_id"] for r in stored_rows(store, "SELECT task_id FROM tasks")}
    assert [r["episode"] for r in stored_rows(store, "SELECT episode FROM explorations ORDER BY episode")] == \
        list(range(KILL_INSIDE)), "nothing of the episode killed mid-commit is stored"

    with run_service("task_manager", ["--conf", str(conf)],  # same store, killed again further on
                     env={"EVOLVER_TM_FAULT": f"kill_before_commit:{KILL_BEFORE}"}) as service:
        assert service.proc.wait(timeout=240) == -9, service.log()[-2000:]
        assert f"resuming job {job_id} at episode {KILL_INSIDE}" in service.log()
    assert stored_rows(store, "SELECT cursor FROM jobs")[0]["cursor"] == KILL_BEFORE

    with run_service("task_manager", ["--conf", str(conf)]) as service:  # same store, no fault
        job = _wait_done(service.url, job_id)
        assert f"resuming job {job_id} at episode {KILL_BEFORE}" in service.log()
    assert job["status"] == "done" and job["cursor"] == EPISODES
    assert job["progress"]["episodes_done"] == EPISODES
    rows = stored_rows(store, "SELECT task_id, signature, query FROM tasks")
    for column in ("task_id", "signature", "query"):
        assert len({r[column] for r in rows}) == len(rows), column
    assert before <= {r["task_id"] for r in rows}
    assert job["progress"]["kept"] == len(rows)
    assert [r["episode"] for r in stored_rows(store, "SELECT episode FROM explorations ORDER BY episode")] == \
        list(range(EPISODES))

    # The same job, never interrupted, ends with the same tasks.
    clean_conf, clean_store = _conf(tmp_path, flights_env, "clean")
    with run_service("task_manager", ["--conf", str(clean_conf)]) as service:
        clean_id = httpx.post(f"{service.url}/v1/jobs", json=JOB, timeout=30).json()["job_id"]
        assert _wait_done(service.url, clean_id)["status"] == "done"
    clean = {r["task_id"] for r in stored_rows(clean_store, "SELECT task_id FROM tasks")}
    assert clean == {r["task_id"] for r in rows}


def test_a_pass_rate_report_with_a_request_id_is_applied_once_across_retries_and_restarts(
        flights_env: ServiceProcess, tmp_path: Path) -> None:
    """The trainer sends each step's report with a request id: a retry after a dropped connection, or a
    resumed run re-sending the step, must not count the same rollouts twice in the curriculum window."""
    conf, store = _conf(tmp_path, flights_env, "feedback")
    report = {"results": [{"task_id": None, "env_type": "flights", "outcomes": [1.0, 0.0, 1.0]}],
              "request_id": "run-a-step3"}
    with run_service("task_manager", ["--conf", str(conf)]) as service:
        task_id = httpx.get(f"{service.url}/v1/tasks", params={"env": "flights", "limit": 1},
                            timeout=30).json()["tasks"][0]["task_id"]
        report["results"][0]["task_id"] = task_id
        first = httpx.post(f"{service.url}/v1/feedback", json=report, timeout=30).json()
        again = httpx.post(f"{service.url}/v1/feedback", json=report, timeout=30).json()
    assert first == {"updated": 1, "idempotent_replay": False}
    assert again == {"updated": 1, "idempotent_replay": True}
    [row] = stored_rows(store, "SELECT total FROM pass_rates")
    assert row["total"] == 3, "the repeated report was applied once"

    with run_service("task_manager", ["--conf", str(conf)]) as service:  # a restart keeps the applied ids
        replay = httpx.post(f"{service.url}/v1/feedback", json=report, timeout=30).json()
        fresh = httpx.post(f"{service.url}/v1/feedback", json={**report, "request_id": "run-a-step4"}, timeout=30)
        unnamed = httpx.post(f"{service.url}/v1/feedback", json={"results": report["results"]}, timeout=30)
    assert replay["idempotent_replay"] is True
    assert fresh.json()["idempotent_replay"] is False and unnamed.status_code == 200
    [row] = stored_rows(store, "SELECT total FROM pass_rates")
    assert row["total"] == 9  # 3 + the new step's 3 + the report without an id


def test_a_full_disk_gets_a_507_and_a_running_job_waits_for_space(flights_env: ServiceProcess,
                                                                   tmp_path: Path) -> None:
    """EVOLVER_DISK_FULL names a flag file: while it exists, the store's commits fail as on a full disk."""
    conf, store = _conf(tmp_path, flights_env, "full")
    flag = tmp_path / "disk-full"
    with run_service("task_manager", ["--conf", str(conf)], env={DISK_FULL_ENV: str(flag)}) as service:
        flag.touch()
        refused = httpx.post(f"{service.url}/v1/jobs", json=JOB, timeout=30)
        assert refused.status_code == 507, refused.text
        assert str(store) in refused.json()["error"]["message"] and stored_rows(store, "SELECT * FROM jobs") == []
        flag.unlink()
        job_id = httpx.post(f"{service.url}/v1/jobs", json=JOB, timeout=30).json()["job_id"]
        deadline = time.monotonic() + 120
        while stored_rows(store, "SELECT cursor FROM jobs")[0]["cursor"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        flag.touch()  # the disk fills up mid-job
        while "is committed once there is space" not in service.log():
            assert time.monotonic() < deadline, service.log()[-2000:]
            time.sleep(0.1)
        held = stored_rows(store, "SELECT cursor FROM jobs")[0]["cursor"]
        assert held < EPISODES and httpx.get(f"{service.url}/healthz", timeout=10).status_code == 200
        flag.unlink()
        job = _wait_done(service.url, job_id)
    assert job["status"] == "done" and job["cursor"] == EPISODES and held >= 2
    rows = stored_rows(store, "SELECT task_id FROM tasks")
    assert job["progress"]["kept"] == len(rows) and job["progress"]["episodes_done"] == EPISODES
    assert [r["episode"] for r in stored_rows(store, "SELECT episode FROM explorations ORDER BY episode")] == \
        list(range(EPISODES))
