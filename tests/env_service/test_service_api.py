"""The service over real HTTP (a subprocess): /v1 shapes, AgentEvolver-compatible shapes, bad input."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from common.http import ServiceCallError
from common.schemas import ChatMessage
from env_service.client import EnvClient
from tests.env_service.service_support import env_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with env_server(tmp_path_factory.mktemp("env"), max_instances=12, max_body_bytes=64 * 1024) as service:
        yield service


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def test_v1_lists_environments_tasks_profile_and_tools(http):
    envs = {e["name"]: e for e in http.get("/v1/environments").json()["environments"]}
    assert set(envs) == {"flights", "gym"}
    assert envs["flights"]["splits"] == {"train": 40, "validation": 8, "test": 8}
    detail = http.get("/v1/environments/flights").json()
    assert detail["task_ids"]["validation"][0] == "validation-0000"
    assert not set(detail["task_ids"]["train"]) & set(detail["task_ids"]["test"])
    tasks = http.get("/v1/environments/gym/tasks", params={"split": "test"}).json()
    assert tasks["task_ids"][0] == "FrozenLake-v1/test-0000" and len(tasks["task_ids"]) == 6
    profile = http.get("/v1/environments/flights/profile").json()
    assert {e["name"] for e in profile["entities"]} == {"flight", "passenger", "order"}
    assert all(e["attrs"] and e["opts"] for e in profile["entities"])
    tools = http.get("/v1/environments/flights/tools").json()["tools"]
    names = {t["function"]["name"] for t in tools}
    assert {"search_flight", "book_ticket", "cancel_order", "get_passenger", "list_orders"} == names
    assert tools[0]["type"] == "function" and "properties" in tools[0]["function"]["parameters"]


async def test_v1_episode_with_typed_client_replaces_query_and_snapshots_state(server):
    async with EnvClient(server.url) as client:
        created = await client.create("flights", "train-0000", params={"query": "Book anything for Elif Silva."})
        assert [m.role for m in created.messages] == ["system", "user"]
        assert created.messages[1].content == "Book anything for Elif Silva."
        iid = created.instance_id
        step = await client.step(iid, "get_passenger(name='Elif Silva')")
        assert step.observation.role == "tool" and '"passenger_id"' in step.observation.content
        assert not step.done
        before = await client.state(iid)
        assert before.state["orders"] == [] and before.state_hash
        # Hidden precondition: booking needs a prior search of the route.
        flight = (await client.step(iid, "search_flight(origin='BOS', destination='MIA', date='2025-06-04')"))
        flight_id = next(f for f in __import__("json").loads(flight.observation.content) if f["seats_left"] > 0)
        booked = await client.step(iid, f"book_ticket(passenger_id='P1005', flight_id='{flight_id['flight_id']}')")
        assert "order_id" in booked.observation.content
        after = await client.state(iid)
        assert len(after.state["orders"]) == 1 and after.state_hash != before.state_hash
        assert after.state["comparable"]["orders"][0]["flight_id"] == flight_id["flight_id"]
        evaluation = await client.evaluate(iid)
        assert 0.0 <= evaluation.score <= 1.0
        assert await client.release(iid) is True
        assert await client.release(iid) is False  # releasing twice is harmless
        with pytest.raises(ServiceCallError) as gone:
            await client.step(iid, "list_orders(passenger_id='P1005')")
        assert gone.value.status == 404 and "released" in gone.value.message


def test_agentevolver_routes_keep_their_shapes(http):
    profile = http.post("/get_env_profile", json={"env_type": "flights", "params": {"split": "validation"}}).json()
    assert profile == {"success": True, "data": [f"validation-{i:04d}" for i in range(8)]}
    created = http.post("/create", json={"env_type": "flights", "task_id": "train-0001", "instance_id": "ae-1",
                                         "params": {}}).json()
    assert created["success"] is True
    assert [m["role"] for m in created["data"]["state"]] == ["system", "user"]
    assert created["data"]["info"]["instance_id"] == "ae-1"
    # Several calls in one message: exactly one message comes back.
    step = http.post("/step", json={"instance_id": "ae-1", "messages": {
        "role": "assistant",
        "content": "[get_passenger(name='Maya Novak'), search_flight(origin='ATL', destination='MIA')]"}}).json()
    assert step["success"] is True and set(step["data"]) == {"state", "reward", "is_terminated", "info"}
    assert len(step["data"]["state"]) == 1 and "[2] search_flight" in step["data"]["state"][0]["content"]
    assert step["data"]["is_terminated"] is False
    info = http.post("/get_info", json={"instance_id": "ae-1"}).json()
    assert info["success"] is True and "book_ticket" in info["data"]
    score = http.post("/evaluate", json={"instance_id": "ae-1", "params": {"sparse": True}}).json()
    assert score == {"success": True, "data": 0.0}
    assert http.post("/release", json={"instance_id": "ae-1"}).json() == {"success": True, "data": None}
    assert http.post("/release", json={"instance_id": "ae-1"}).json()["success"] is False
    assert http.get("/healthz").status_code == 200


def test_agentevolver_errors_are_success_false(http):
    missing = http.post("/step", json={"instance_id": "nope", "messages": {"role": "assistant", "content": "x"}})
    assert missing.status_code == 404
    body = missing.json()
    assert body["success"] is False and "nope" in body["message"] and body["error"]["code"] == "unknown_instance"
    unknown_env = http.post("/create", json={"env_type": "appworld", "task_id": "1"})
    assert unknown_env.status_code == 404 and unknown_env.json()["success"] is False
    assert "flights" in unknown_env.json()["message"]
    no_task = http.post("/create", json={"env_type": "flights"})
    assert no_task.status_code == 400 and no_task.json()["message"] == "task_id is required"
    bad_json = http.post("/create", content=b"{not json", headers={"content-type": "application/json"})
    assert bad_json.status_code == 422 and bad_json.json()["success"] is False


def test_bad_input_is_answered_clearly_and_disturbs_nothing(http):
    live = http.post("/v1/instances", json={"env": "flights", "task_id": "train-0002"}).json()["instance_id"]
    unknown_env = http.post("/v1/instances", json={"env": "nethack", "task_id": "x"})
    assert unknown_env.status_code == 404
    assert unknown_env.json()["error"]["details"]["known"] == ["flights", "gym"]
    unknown_task = http.post("/v1/instances", json={"env": "flights", "task_id": "train-9999"})
    assert unknown_task.status_code == 404 and unknown_task.json()["error"]["code"] == "unknown_task"
    unknown_instance = http.post("/v1/instances/inst_missing/step", json={"action": {"role": "assistant", "content": "x"}})
    assert unknown_instance.status_code == 404 and "inst_missing" in unknown_instance.json()["error"]["message"]
    malformed = http.post(f"/v1/instances/{live}/step", json={"action": {"role": "wizard", "content": "x"}})
    assert malformed.status_code == 422
    assert malformed.json()["error"]["details"][0]["field"] == "body.action.role"
    missing_field = http.post("/v1/instances", json={"task_id": "train-0000"})
    assert missing_field.status_code == 422 and "body.env" in missing_field.json()["error"]["message"]
    oversized = http.post(f"/v1/instances/{live}/step",
                          json={"action": {"role": "assistant", "content": "x" * 100_000}})
    assert oversized.status_code == 413
    bad_call = http.post(f"/v1/instances/{live}/step", json={"action": {"role": "assistant",
                                                                      "content": "book_ticket(passenger_id=P1)"}})
    assert bad_call.status_code == 200 and "not a literal" in bad_call.json()["observation"]["content"]
    # The live instance still works after all that.
    ok = http.post(f"/v1/instances/{live}/step", json={"action": {"role": "assistant",
                                                                "content": "list_orders(passenger_id='P1001')"}})
    assert ok.status_code == 200 and ok.json()["observation"]["role"] == "tool"
    assert http.delete(f"/v1/instances/{live}").json()["released"] is True


async def test_instance_cap_answers_429_and_keeps_live_instances(server):
    async with EnvClient(server.url, retries=0) as client:
        baseline = len((await client.instances())["instances"])
        ids = [(await client.create("gym", "FrozenLake-v1/train-0000")).instance_id for _ in range(12 - baseline)]
        async with httpx.AsyncClient(base_url=server.url) as raw:
            over = await raw.post("/v1/instances", json={"env": "gym", "task_id": "FrozenLake-v1/train-0000"})
        assert over.status_code == 429 and over.headers["retry-after"].isdigit()
        assert over.json()["error"]["code"] == "too_many_instances"
        steps = await asyncio.gather(*(client.step(i, "Action: down") for i in ids))
        assert all(s.observation.role == "user" for s in steps)
        await asyncio.gather(*(client.release(i) for i in ids))
        assert (await client.create("gym", "Taxi-v4/train-0000")).instance_id


def test_gym_text_episode_and_invalid_action(http):
    created = http.post("/v1/instances", json={"env": "gym", "task_id": "CliffWalking-v1/train-0000"}).json()
    iid = created["instance_id"]
    assert "x  C  C" in created["messages"][1]["content"]
    invalid = http.post(f"/v1/instances/{iid}/step", json={"action": {"role": "assistant", "content": "jump!"}}).json()
    assert "up (0), right (1), down (2), left (3)" in invalid["observation"]["content"] and not invalid["done"]
    for move in ["Action: up"] + ["Action: right"] * 11 + ["Action: down"]:
        result = http.post(f"/v1/instances/{iid}/step", json={"action": {"role": "assistant", "content": move}}).json()
    assert result["done"] is True and result["info"]["terminated"] is True
    assert http.post(f"/v1/instances/{iid}/evaluate", json={}).json()["score"] == 1.0
    http.delete(f"/v1/instances/{iid}")


def test_openai_tool_calls_get_a_tool_message_with_the_call_id(http):
    iid = http.post("/v1/instances", json={"env": "flights", "task_id": "train-0003"}).json()["instance_id"]
    action = ChatMessage(role="assistant", content=None, tool_calls=[{"id": "call_1", "function": {
        "name": "get_passenger", "arguments": '{"name": "Quinn Smith"}'}}])
    result = http.post(f"/v1/instances/{iid}/step", json={"action": action.model_dump()}).json()
    assert result["observation"]["tool_call_id"] == "call_1" and "P10" in result["observation"]["content"]
    http.delete(f"/v1/instances/{iid}")
