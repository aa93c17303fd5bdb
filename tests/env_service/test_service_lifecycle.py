"""Instance lifecycle over real HTTP: idle reaping, per-call timeouts, plugins from config only."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import httpx
import pytest

from common.config import ConfigError
from env_service.registry import load_environments
from tests.env_service.service_support import env_server
from tests.helpers import REPO

PLUGIN = {"slow": "tests.env_service.service_slow_env:SlowEnvironment"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with env_server(tmp_path_factory.mktemp("life"), environments={"slow": {}, "flights": {}}, plugins=PLUGIN,
                    instance_ttl_s=1.0, reap_interval_s=0.2, call_timeout_s=1.0) as service:
        yield service


def step(client: httpx.Client, iid: str, content: str) -> httpx.Response:
    return client.post(f"/v1/instances/{iid}/step", json={"action": {"role": "assistant", "content": content}})


def test_idle_instances_are_reaped_and_busy_ones_kept(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        idle = client.post("/v1/instances", json={"env": "slow", "task_id": "only"}).json()["instance_id"]
        busy = client.post("/v1/instances", json={"env": "slow", "task_id": "only"}).json()["instance_id"]
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            assert step(client, busy, "go").status_code == 200
            time.sleep(0.2)
        gone = step(client, idle, "go")
        assert gone.status_code == 404 and "reaped after 1s idle" in gone.json()["error"]["message"]
        assert client.get("/v1/instances").json()["stats"]["reaped"] >= 1
        assert client.delete(f"/v1/instances/{busy}").json()["released"] is True


async def test_a_hanging_step_times_out_without_blocking_others(server):
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        ids = []
        for _ in range(2):
            created = await client.post("/v1/instances", json={"env": "slow", "task_id": "only"})
            ids.append(created.json()["instance_id"])
        hanging = asyncio.create_task(client.post(f"/v1/instances/{ids[0]}/step",
                                                  json={"action": {"role": "assistant", "content": "sleep 3"}}))
        await asyncio.sleep(0.1)
        quick = await client.post(f"/v1/instances/{ids[1]}/step",
                                  json={"action": {"role": "assistant", "content": "go"}})
        assert quick.status_code == 200 and not hanging.done()  # the other instance is not blocked
        timed_out = await hanging
        assert timed_out.status_code == 504 and timed_out.json()["error"]["code"] == "timeout"
        after = await client.post(f"/v1/instances/{ids[0]}/step", json={"action": {"role": "assistant", "content": "go"}})
        assert after.status_code == 404 and "exceeded the 1s timeout" in after.json()["error"]["message"]
        again = await client.post(f"/v1/instances/{ids[1]}/step", json={"action": {"role": "assistant", "content": "go"}})
        assert again.json()["observation"]["content"] == "step 2"
        await client.delete(f"/v1/instances/{ids[1]}")


def test_duplicate_caller_ids_are_refused(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        body = {"env": "flights", "task_id": "train-0000", "instance_id": "mine"}
        assert client.post("/v1/instances", json=body).status_code == 201
        again = client.post("/v1/instances", json=body)
        assert again.status_code == 409 and "already exists" in again.json()["error"]["message"]
        client.delete("/v1/instances/mine")
        assert client.post("/v1/instances", json=body).status_code == 201  # free again after release
        client.delete("/v1/instances/mine")


def test_only_allowlisted_environments_load():
    with pytest.raises(ConfigError, match="unknown environment; known: babyai, bfcl, flights, gem, gym, reasoning_gym, remote"):
        load_environments({"os": {}})
    with pytest.raises(ConfigError, match="cannot import os.system"):
        load_environments({"x": {}}, {"x": "os.system"})
    with pytest.raises(ConfigError, match="import-only"):  # an importable module with no class to serve
        load_environments({"x": {}}, {"x": "os.path"})
    with pytest.raises(ConfigError, match="not an Environment subclass"):
        load_environments({"x": {}}, {"x": "os:system"})
    with pytest.raises(ConfigError, match="unknown flights config key"):
        load_environments({"flights": {"sed": 1}})


def test_a_taken_port_stops_the_service_before_it_builds_anything():
    # The port is bound before the environments load: a Java gateway or a Ray worker started
    # while they load can then never take it, and a clash fails at once, naming the flag.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "env_service", "--host", "127.0.0.1", "--port", str(port)],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "--port" in done.stderr
    assert "environments:" not in done.stderr + done.stdout
