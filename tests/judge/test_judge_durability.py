"""The judge's audit log under a kill mid-write and a full disk, over real HTTP.

A kill halfway through a request's audit lines (EVOLVER_JUDGE_FAULT=audit:torn:<n>) loses no line of an
answered request once the judge is restarted on the same file: a judge that appended after the torn half
without cutting it off would glue the next request's first line onto it. A full disk (EVOLVER_DISK_FULL
names a flag file; while it exists, writes fail with ENOSPC) gets a 507 naming the audit file, leaves the
file as it was, and the next request after space is back is answered and audited.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import pytest

from common.faults import DISK_FULL_ENV, JUDGE_FAULT_ENV
from judge.client import to_judge_trajectory
from tests.helpers import run_service
from tests.judge.fake_judge_llm import fake_judge_llm
from tests.judge.test_judge_service import trajectory


def judge_body(name: str) -> dict:
    trajectories = [trajectory(f"{name}-{i}", name, ["useful search", "idle chatter"], 1.0, f"task {name}")
                    for i in range(2)]
    return {"trajectories": [to_judge_trajectory(t).model_dump(mode="json") for t in trajectories]}


def post(url: str, name: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/judge", json=judge_body(name), headers={"x-request-id": name}, timeout=60)


def test_the_audit_survives_a_kill_mid_write_and_a_full_disk(tmp_path: Path) -> None:
    audit, flag = tmp_path / "audit.jsonl", tmp_path / "disk-full"
    with fake_judge_llm() as (llm_url, _):
        conf = tmp_path / "run.yaml"
        conf.write_text(json.dumps({"judge": {"llm": {"base_url": llm_url, "model": "fake-judge", "max_retries": 0},
                                              "audit_log": str(audit)}}))
        # The third audited request is torn: the first, and the second once the disk has space again.
        with run_service("judge", ["--conf", str(conf)], timeout=60,
                         env={JUDGE_FAULT_ENV: "audit:torn:3", DISK_FULL_ENV: str(flag)}) as judge:
            assert post(judge.url, "first").status_code == 200
            kept = audit.read_bytes()
            flag.touch()
            full = post(judge.url, "second")
            assert full.status_code == 507, full.text
            error = full.json()["error"]
            assert error["code"] == "insufficient_storage" and str(audit) in error["message"]
            assert "free space on that disk" in error["message"]
            assert audit.read_bytes() == kept, "what it had is kept"
            flag.unlink()
            assert post(judge.url, "second").status_code == 200, "it works again once writes succeed"
            with pytest.raises(httpx.TransportError):
                post(judge.url, "third")
            assert judge.proc.wait(timeout=30) == -signal.SIGKILL
        assert not audit.read_bytes().endswith(b"\n"), "the kill left half a line"
        with run_service("judge", ["--conf", str(conf)], timeout=60) as judge:
            assert post(judge.url, "fourth").status_code == 200
    records = [json.loads(line) for line in audit.read_text().splitlines()]  # a torn or glued line fails here
    answered = [r["request_id"] for r in records if r["request_id"] != "third"]
    assert answered == ["first", "first", "second", "second", "fourth", "fourth"]
