"""The /v1 protocol is documented where clients read it: every request and response body of every /v1
route has a named model with an example in the served OpenAPI document, and the `remote` settings
describe themselves."""

from __future__ import annotations

import httpx

from env_service.app import build_app
from env_service.environments.remote import RemoteConfig
from env_service.settings import EnvServiceSettings
from tests.helpers import InProcessServer


def test_every_v1_body_has_a_documented_model_with_an_example():
    with InProcessServer(build_app(EnvServiceSettings(environments={"signal": {}}))) as server:
        document = httpx.get(f"{server.url}/openapi.json").json()
    schemas = document["components"]["schemas"]

    def documented(content: dict, where: str) -> str:
        schema = content["application/json"]["schema"]
        # An optional body (evaluate's) is "the model or nothing".
        ref = schema.get("$ref") or next((s["$ref"] for s in schema.get("anyOf", []) if "$ref" in s), "")
        name = ref.rsplit("/", 1)[-1]
        assert name in schemas, f"{where}: no named model (got {content})"
        assert schemas[name].get("examples"), f"{where}: model {name} has no example"
        return name

    routes = 0
    for path, operations in document["paths"].items():
        if not path.startswith("/v1"):
            continue
        for method, operation in operations.items():
            where = f"{method.upper()} {path}"
            ok = next(code for code in ("200", "201") if code in operation["responses"])
            documented(operation["responses"][ok]["content"], where)
            if "requestBody" in operation:
                documented(operation["requestBody"]["content"], where + " request")
            routes += 1
    assert routes == 14  # every /v1 route, the train-reference and fork routes included
    assert "params.query" not in schemas["CreateRequest"]["properties"]["params"]["description"]
    assert "`query`: replaces the task's user query" in schemas["CreateRequest"]["properties"]["params"]["description"]


def test_the_remote_settings_describe_themselves():
    for name in ("url", "env_type", "protocol", "timeout_s", "api_token_env"):
        assert RemoteConfig.model_fields[name].description, name
    assert "required" in RemoteConfig.model_fields["env_type"].description


def test_a_gym_env_supplies_its_own_description_and_per_task_instruction():
    from tests.env_service.keydoor_plugin import DOORS, ENV_ID

    settings = EnvServiceSettings(environments={"gym": {"envs": [ENV_ID], "splits": {"train": 6}}},
                                  plugins={"keydoor": "tests.env_service.keydoor_plugin"})
    with InProcessServer(build_app(settings)) as server:
        def opening(task: str, **params: str) -> list[str]:
            answer = httpx.post(f"{server.url}/v1/instances", json={"env": "gym", "task_id": task, "params": params})
            assert answer.status_code == 201, answer.text
            return [m["content"] for m in answer.json()["messages"]]

        goals = set()
        for i in range(6):
            system, user = opening(f"{ENV_ID}/train-{i:04d}")
            assert "the key opens exactly one of them" in system and "take (0)" in system
            goals.add(user.splitlines()[0])
        assert goals <= {f"Take the key, then open the {door} door." for door in DOORS} and len(goals) > 1
        _, user = opening(f"{ENV_ID}/train-0000", query="Open no door at all.")
        assert user.startswith("Open no door at all.")
