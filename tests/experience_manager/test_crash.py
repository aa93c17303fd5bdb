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



def test_the_journal_is_compacted_and_a_kill_while_compacting_loses_nothing(tmp_path):
    """A long run's journal stays bounded: it is rewritten as a snapshot past `journal_compact_records`, so a
    restart reads a bounded file. Request ids and the pool survive compaction, a kill in the middle of it,
    and the studio's offline replay; `idempotency_window` bounds the ids a restart keeps."""
    from experience_manager.journal import Journal
    from studio.sources import replay_journal

    store = tmp_path / "store"
    journal = store / "journal.jsonl"

    def args(**section) -> list[str]:
        return ["--store", str(store), "--conf",
                write_conf(tmp_path / "conf.yaml", {"journal_compact_records": 10, **section})]

    def add(http: httpx.Client, i: int) -> httpx.Response:
        return http.post("/v1/workspaces/ws/experiences", json={
            "when_to_use": f"When booking flight {i} for passenger {i * 7}", "content": f"Search date {i} first.",
            "request_id": f"add-{i}"})

    with run_service("experience_manager", args(), env={FAULT_ENV: "compact:before_rewrite:0"}) as svc:
        http = httpx.Client(base_url=svc.url, timeout=60)
        ids = [add(http, i).json()["experience"]["experience_id"] for i in range(4)]  # 8 records
        _killed(svc, lambda: add(http, 4))  # its intent and commit make 10: compaction starts, and is killed
    assert sum(1 for _ in journal.open()) == 10 and not journal.with_name("journal.jsonl.prev").exists()

    with run_service("experience_manager", args()) as svc:
        http = httpx.Client(base_url=svc.url, timeout=60)
        retried = add(http, 4).json()
        assert retried["idempotent_replay"] is True, "the write was durable before the kill"
        ids += [retried["experience"]["experience_id"]] + [add(http, i).json()["experience"]["experience_id"] for i in range(5, 40)]
        lines = sum(1 for _ in journal.open())
        assert lines < 10, f"72 records written, the journal holds {lines}: it is compacted as it grows"
        previous = [record["t"] for record in Journal(journal.with_name("journal.jsonl.prev")).read()]
        assert previous[0] == "snapshot" and previous.count("intent") == previous.count("commit") >= 4
        live = {e["experience_id"] for e in http.get("/v1/workspaces/ws/experiences?limit=100").json()["experiences"]}
    assert live == set(ids)
    assert {e.experience_id for e in replay_journal(Journal(journal).read(), "ws")} == live

    with run_service("experience_manager", args(idempotency_window=3)) as svc:
        http = httpx.Client(base_url=svc.url, timeout=60)
        assert add(http, 39).json()["idempotent_replay"] is True
        assert add(http, 0).json().get("idempotent_replay") is None, "ids older than the window are new requests"
        assert http.get("/v1/workspaces/ws/stats").json()["active"] >= 40
