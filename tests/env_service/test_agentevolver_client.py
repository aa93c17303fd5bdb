"""What AgentEvolver's trainer-side env client sends, byte for byte in shape, against a real env_service.

Its client (agentevolver/client/env_client.py, read, not copied) strips the base URL's trailing
slash and joins `f"{base}/{endpoint}"`, with endpoint "/get_env_profile" for the profile and bare
names otherwise: the profile request goes to `//get_env_profile`. Every body carries all five fields
(`env_type` defaults to "default", unused ones null, `messages`/`params` `{}`); a step's `messages` is
one assistant message; evaluate sends `params={"sparse": ...}`. Responses are read as `data`,
`data.state`, `data.info.instance_id`, `data.reward`, `data.is_terminated` and `success`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest

from common.actions import ParsedCall
from env_service.environments.flights import FlightsEnvironment
from tests.env_service.service_support import env_server
from tests.helpers import ServiceProcess


class AgentEvolverStyleClient:
    """Our own re-statement of the request shapes of AgentEvolver's EnvClient."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(timeout=60)
        self.paths: list[str] = []

    def request(self, endpoint: str, env_type: str = "default", task_id: str | None = None,
                instance_id: str | None = None, messages: dict | None = None, params: dict | None = None) -> dict:
        url = f"{self.base_url}/{endpoint}"
        self.paths.append(httpx.URL(url).path)
        body = {"env_type": env_type, "task_id": task_id, "instance_id": instance_id,
                "messages": messages or {}, "params": params or {}}
        response = self.http.post(url, json=body)
        response.raise_for_status()
        return response.json()

    def get_env_profile(self, env_type: str, split: str = "train") -> list[str]:
        return self.request("/get_env_profile", env_type=env_type, params={"split": split})["data"]

    def create_instance(self, env_type: str, task_id: str) -> dict[str, Any]:
        return self.request("create", env_type=env_type, task_id=task_id)["data"]

    def step(self, instance_id: str, action: dict) -> dict[str, Any]:
        return self.request("step", instance_id=instance_id, messages=action)["data"]

    def get_tools_info(self, instance_id: str) -> Any:
        return self.request("get_info", instance_id=instance_id)["data"]

    def evaluate(self, instance_id: str, sparse: bool) -> float:
        return self.request("evaluate", instance_id=instance_id, params={"sparse": sparse})["data"]

    def release_instance(self, instance_id: str) -> bool:
        return self.request("release", instance_id=instance_id)["success"]


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> Iterator[ServiceProcess]:
    with env_server(tmp_path_factory.mktemp("ae-client")) as server:
        yield server


def test_profiles_over_the_double_slash_path(service):
    client = AgentEvolverStyleClient(service.url + "/")
    profiles = {split: client.get_env_profile("flights", split) for split in ("train", "validation", "test")}
    assert {split: len(ids) for split, ids in profiles.items()} == {"train": 40, "validation": 8, "test": 8}
    assert client.paths == ["//get_env_profile"] * 3
    assert client.get_env_profile("gym")[0] == "FrozenLake-v1/train-0000"


def test_full_flights_episodes_scored_as_the_environment_scores_them(service):
    client = AgentEvolverStyleClient(service.url)
    flights = FlightsEnvironment({"splits": {"train": 40, "validation": 8, "test": 8}})
    # Booking tasks: their reference calls name no order ids, so they replay as written.
    booking = [t for t in client.get_env_profile("flights") if flights.task(t).kind == "book_cheapest"][:2]
    for task_id, solve in zip(booking, (True, False), strict=True):
        created = client.create_instance("flights", task_id)
        assert [m["role"] for m in created["state"]] == ["system", "user"]
        instance_id = created["info"]["instance_id"]
        tools = {t["function"]["name"] for t in json.loads(client.get_tools_info(instance_id))}
        assert {"search_flight", "book_ticket"} <= tools
        reference = flights.task(task_id).reference
        for name, arguments in reference if solve else reference[:2]:
            step = client.step(instance_id, {"role": "assistant", "content": ParsedCall(name, arguments).to_python()})
            assert len(step["state"]) == 1 and step["is_terminated"] is False
            assert not step["state"][0]["content"].startswith("Error"), step["state"][0]["content"]
        final = client.step(instance_id, {"role": "assistant", "content": "All done."})
        assert final["is_terminated"] is True and final["reward"] == (1.0 if solve else 0.0)
        assert client.evaluate(instance_id, sparse=True) == (1.0 if solve else 0.0)
        assert client.release_instance(instance_id) is True
    assert client.release_instance(instance_id) is False  # AgentEvolver reads `success` of a second release


def test_422_bodies_are_what_the_openapi_document_says(service):
    document = httpx.get(f"{service.url}/openapi.json").json()
    components = document["components"]["schemas"]
    for path, shape in [("/create", "CompatError"), ("/v1/instances", "ErrorResponse")]:
        documented = document["paths"][path]["post"]["responses"]["422"]["content"]["application/json"]["schema"]
        assert documented == {"$ref": f"#/components/schemas/{shape}"}
        sent = httpx.post(f"{service.url}{path}", json={"env_type": 5, "messages": 7, "env": 3})
        assert sent.status_code == 422
        jsonschema.validate(sent.json(), {**components[shape], "components": document["components"]},
                            cls=jsonschema.Draft202012Validator)
    assert components["CompatError"]["properties"]["detail"]["type"] == "string"
    assert "HTTPValidationError" not in components
