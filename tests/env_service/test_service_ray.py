"""The ray backend over real HTTP: a small actor pool; killing one actor loses only its instances."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.env_service.service_support import env_server

pytestmark = pytest.mark.slow


def step(client: httpx.Client, iid: str, content: str) -> httpx.Response:
    return client.post(f"/v1/instances/{iid}/step", json={"action": {"role": "assistant", "content": content}})


def assert_lost(response: httpx.Response) -> None:
    """410 `instance_lost` naming the cause: a client collects the episode again on that answer alone."""
    assert response.status_code == 410, response.text
    error = response.json()["error"]
    assert error["code"] == "instance_lost" and "died" in error["message"]


def test_actor_death_fails_only_its_instances_and_the_actor_is_replaced(tmp_path):
    with env_server(tmp_path, backend="ray", ray={"actors": 2, "health_check_s": 2.0}, reap_interval_s=0.5) as server, \
            httpx.Client(base_url=server.url, timeout=60) as client:
        ids = [client.post("/v1/instances", json={"env": "flights", "task_id": f"train-{i:04d}"}).json()["instance_id"]
               for i in range(6)]
        hosts = {iid: client.get(f"/v1/instances/{iid}").json()["host"] for iid in ids}
        assert {h["actor"] for h in hosts.values()} == {0, 1}  # spread over the pool, not one actor each
        for iid in ids:
            assert step(client, iid, "list_orders(passenger_id='P1001')").status_code == 200
        victim_pid = hosts[ids[0]]["pid"]
        os.kill(victim_pid, signal.SIGKILL)
        doomed = [i for i in ids if hosts[i]["pid"] == victim_pid]
        survivors = [i for i in ids if hosts[i]["pid"] != victim_pid]
        assert_lost(step(client, doomed[0], "list_orders(passenger_id='P1001')"))  # this call finds the death
        for iid in survivors:
            assert step(client, iid, "get_passenger(passenger_id='P1001')").status_code == 200
        deadline = time.monotonic() + 30  # the replacement reports its pid at the next health check
        while time.monotonic() < deadline:
            stats = client.get("/v1/instances").json()["stats"]
            if stats["replacements"] == 1 and None not in stats["actor_pids"]:
                break
            time.sleep(0.3)
        assert stats["replacements"] == 1 and victim_pid not in stats["actor_pids"]
        # The health check has forgotten the others: a call on one is still told it was lost, not that it is unknown.
        assert len(doomed) > 1
        for iid in doomed[1:]:
            assert_lost(step(client, iid, "list_orders(passenger_id='P1001')"))
        fresh = [client.post("/v1/instances", json={"env": "flights", "task_id": "train-0001"}).json()["instance_id"]
                 for _ in range(3)]
        for iid in fresh:
            assert step(client, iid, "get_passenger(name='Maya Novak')").status_code == 200
        # Least-loaded placement: the emptied slot, now hosted by the new actor, takes them.
        fresh_hosts = [client.get(f"/v1/instances/{i}").json()["host"] for i in fresh]
        assert all(h["actor"] == hosts[doomed[0]]["actor"] and h["pid"] != victim_pid for h in fresh_hosts)
        created = client.post("/create", json={"env_type": "flights", "task_id": "train-0002"}).json()
        assert created["success"] is True and len(created["data"]["state"]) == 2
