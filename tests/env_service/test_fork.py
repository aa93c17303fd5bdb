"""`POST /v1/instances/{id}/fork` over real HTTP: an independent copy for an environment that declares `fork`
(flights v2), a 409 naming the environment for one that does not, and the capabilities the client reads."""

from __future__ import annotations

import asyncio
import json

import pytest

from common.http import ServiceCallError
from env_service.app import build_app
from env_service.client import EnvClient
from env_service.settings import EnvServiceSettings
from tests.helpers import InProcessServer

FLIGHTS = {"version": 2, "tiers": [2], "splits": {"train": 4, "validation": 2, "test": 2}}
GYM = {"envs": ["FrozenLake-v1"], "splits": {"train": 2, "validation": 1, "test": 1}}


def test_a_fork_is_an_independent_copy_and_an_environment_without_it_is_refused():
    settings = EnvServiceSettings(environments={"flights": FLIGHTS, "gym": GYM})
    with InProcessServer(build_app(settings)) as server:
        asyncio.run(_scenario(server.url))


async def _scenario(url: str) -> None:
    async with EnvClient(url) as client:
        assert await client.capabilities("flights") == {"fork": True, "deterministic": False}
        assert await client.capabilities("gym") == {"fork": False, "deterministic": True}
        # cancel_by_id: a preloaded order to find (list_orders), then cancel by its generated id.
        task_id = "train-t2-0001"
        created = await client.create("flights", task_id)
        original = created.instance_id
        passenger = (await client.state(original)).state["orders"][0]["passenger_id"]
        listed = await client.step(original, f"list_orders(passenger_id='{passenger}')")
        order_id = json.loads(listed.observation.content)[0]["order_id"]
        before = (await client.state(original)).state

        fork = await client.fork(original, f"{original}-branch")
        assert (fork.instance_id, fork.forked_from, fork.env, fork.task_id, fork.steps) == (
            f"{original}-branch", original, "flights", task_id, 1)
        assert (await client.state(fork.instance_id)).state == before  # the same state, generated ids included
        # Stepping the fork does not move the original; the order id the agent saw is valid in the fork.
        cancelled = await client.step(fork.instance_id, f"cancel_order(order_id='{order_id}')")
        assert '"status": "cancelled"' in cancelled.observation.content
        assert (await client.evaluate(fork.instance_id)).score == 1.0
        assert (await client.state(original)).state == before
        assert (await client.evaluate(original)).score == 0.0
        # ... and stepping the original does not move the fork.
        fork_state = (await client.state(fork.instance_id)).state
        await client.step(original, "search_flight(origin='SFO', destination='JFK')")
        assert (await client.state(fork.instance_id)).state == fork_state
        with pytest.raises(ServiceCallError) as taken:
            await client.fork(original, fork.instance_id)
        assert taken.value.status == 409 and taken.value.code == "instance_exists"
        assert await client.release(fork.instance_id) and await client.release(original)

        game = await client.create("gym", "FrozenLake-v1/train-0000")
        with pytest.raises(ServiceCallError) as refused:
            await client.fork(game.instance_id)
        assert refused.value.status == 409 and refused.value.code == "fork_unsupported"
        assert "environment 'gym' cannot fork" in refused.value.message
        assert "does not copy its state" in refused.value.message
        assert len((await client.instances())["instances"]) == 1  # the refusal left nothing behind
        await client.release(game.instance_id)
