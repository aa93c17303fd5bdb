"""Crash safety: SIGKILL at deterministic points inside mutations, restart, nothing lost or counted twice;
then a full disk (a 507, nothing lost, writes again once there is space)."""

from __future__ import annotations

import signal

import httpx
import pytest

from common.faults import DISK_FULL_ENV
from experience_manager.faults import FAULT_ENV
from tests.experience_manager.conftest import TASKS, chat_trajectory, write_conf
from tests.helpers import run_service

pytestmark = pytest.mark.slow


def _killed(service, send) -> None:
    with pytest.raises(httpx.TransportError):
        send()
    assert service.proc.wait(timeout=30) == -signal.SIGKILL


def test_sigkill_inside_batches_loses_nothing_and_counts_nothing_twice(tmp_path):
    store = str(tmp_path / "store")
    # One point per Qdrant upsert, so "after 2 points" is a point in the middle of a 4-point batch.
    args = ["--store", store, "--conf", write_conf(tmp_path / "conf.yaml", {"upsert_batch_size": 1})]
    trajectories = [chat_trajectory(t, q, c, 1.0) for t, q, c, _ in TASKS]
    summarize = {"trajectories": trajectories, "request_id": "batch-1"}

    with run_service("experience_manager", args, env={FAULT_ENV: "summarize:after_upsert:2"}) as svc:
        http = httpx.Client(base_url=svc.url, timeout=60)
        seed = http.post("/v1/workspaces/ws/experiences", json={
            "when_to_use": "When a tool answers with a rate-limit error", "content": "Wait and retry once."}).json()
        seed_id = seed["experience"]["experience_id"]
        _killed(svc, lambda: http.post("/v1/workspaces/ws/summarize", json=summarize))

    with run_service("experience_manager", args, env={FAULT_ENV: "feedback:after_upsert:1"}) as svc:
        http = httpx.Client(base_url=svc.url, timeout=60)
        listed = http.get("/v1/workspaces/ws/experiences").json()["experiences"]
        assert len(listed) == 1 + len(TASKS), "the interrupted batch was replayed completely on restart"
        assert all(e["support"] == 1 for e in listed)
        # The trainer retries its request (same id): it gets the replayed answer, nothing is added.
        retry = http.post("/v1/workspaces/ws/summarize", json=summarize).json()
        assert retry["idempotent_replay"] is True and len(retry["created"]) == len(TASKS)
        assert http.get("/v1/workspaces/ws/stats").json()["active"] == 1 + len(TASKS)
        used = [seed_id, *retry["created"][:2]]
        feedback = {"request_id": "fb-1", "items": [{"experience_ids": used, "reward": 1.0, "baseline": 0.5}]}
        _killed(svc, lambda: http.post("/v1/workspaces/ws/feedback", json=feedback))

    flag = tmp_path / "disk-full"  # while it exists, the journal's appends fail with ENOSPC
    with run_service("experience_manager", args, env={DISK_FULL_ENV: str(flag)}) as svc:
        with httpx.Client(base_url=svc.url, timeout=60) as http:
            for experience_id in used:
                usage = http.get(f"/v1/workspaces/ws/experiences/{experience_id}").json()["usage"]
                assert usage["uses"] == 1 and usage["advantage_count"] == 1
            assert http.post("/v1/workspaces/ws/feedback", json=feedback).json()["idempotent_replay"] is True
            assert http.get(f"/v1/workspaces/ws/experiences/{seed_id}").json()["usage"]["uses"] == 1
            found = http.post("/v1/workspaces/ws/retrieve", json={"query": TASKS[0][3]}).json()
            assert found["experience_ids"][0] in retry["created"]

            # A full disk: a 507 naming the journal, the pool as it was, and writes again once there is space.
            flag.touch()
            new = {"when_to_use": "When a search finds nothing", "content": "Widen the dates."}
            full = http.post("/v1/workspaces/ws/experiences", json=new)
            assert full.status_code == 507, full.text
            assert str(tmp_path / "store" / "journal.jsonl") in full.json()["error"]["message"]
            assert http.get("/v1/workspaces/ws/stats").json()["active"] == 1 + len(TASKS)
            flag.unlink()
            assert http.post("/v1/workspaces/ws/experiences", json=new).status_code == 200
            assert http.get("/v1/workspaces/ws/stats").json()["active"] == 2 + len(TASKS)
    journal = (tmp_path / "store" / "journal.jsonl").read_text().splitlines()
    assert sum('"replayed":true' in line for line in journal) == 2  # the two mid-batch kills

