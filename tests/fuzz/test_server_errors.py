"""Each request that used to get a 500 (issue 15), sent raw over a socket: now a 4xx naming the field.

Bodies are written as bytes: a lone surrogate (`\\udc00`) or an integer beyond 64 bits is exactly what
a JSON encoder of a careful client would refuse to produce, and what a careless one sends.
"""

from __future__ import annotations

import httpx

from tests.helpers import ServiceProcess

BIG = "18446744073709551616"  # 2**64: one past what orjson (and numpy's uint64) can hold
SURROGATE = "x\\udc00y"  # a JSON escape of a lone low surrogate: valid JSON text, no valid UTF-8


def post(service: ServiceProcess, path: str, body: str) -> httpx.Response:
    return httpx.post(f"{service.url}{path}", content=body.encode(), timeout=60,
                      headers={"content-type": "application/json"})


def assert_names_field(response: httpx.Response, field: str) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"] if "error" in response.json() else response.json()["metadata"]["error"]
    assert error["details"][0]["field"] == field and field in error["message"], error


def test_gym_negative_seed_is_a_4xx_naming_the_environments_reason(env_service):
    response = post(env_service, "/v1/instances",
                    '{"env": "gym", "task_id": "FrozenLake-v1/train-0000", "params": {"seed": -1}}')
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "environment_error" and "Seed" in response.json()["error"]["message"]


def test_gym_seed_beyond_64_bits_is_refused_before_create(env_service):
    response = post(env_service, "/v1/instances",
                    f'{{"env": "gym", "task_id": "FrozenLake-v1/train-0000", "params": {{"seed": {BIG}}}}}')
    assert_names_field(response, "body.params.seed")
    # the largest seed that fits still creates, and its state can be read back
    created = post(env_service, "/v1/instances",
                   '{"env": "gym", "task_id": "FrozenLake-v1/train-0000", "params": {"seed": 18446744073709551615}}')
    assert created.status_code in (201, 400), created.text
    if created.status_code == 201:
        instance = created.json()["instance_id"]
        assert httpx.get(f"{env_service.url}/v1/instances/{instance}/state").status_code == 200
        httpx.delete(f"{env_service.url}/v1/instances/{instance}")


def test_compat_route_keeps_its_shape_for_the_json_rule(env_service):
    response = post(env_service, "//create", f'{{"env_type": "gym", "task_id": "{SURROGATE}"}}')
    assert response.status_code == 422 and response.json()["success"] is False
    assert response.json()["error"]["details"][0]["field"] == "body.task_id"


def test_reme_tool_calls_of_the_wrong_type_are_refused_and_nothing_is_stored(experience_manager):
    """`tool_calls: 5` used to be stored as an experience without calls; now a 422 naming the field, and the
    pool (every workspace's experiences) is exactly what it was, though the request's other trajectory is fine."""
    url = experience_manager.url
    good = ('{"messages": [{"role": "user", "content": "Turn off the hall light"}, '
            '{"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", '
            '"function": {"name": "set_light", "arguments": "{\\"on\\": false}"}}]}], "score": 1.0}')
    seeded = post(experience_manager, "/summary_task_memory",
                  f'{{"workspace_id": "reme_types", "trajectories": [{good}]}}')
    assert seeded.status_code == 200 and seeded.json()["metadata"]["update_result"]["inserted_count"] == 1, seeded.text

    def pool() -> dict:
        """Every workspace (its counts and pool version) and every experience in it."""
        workspaces = httpx.get(f"{url}/v1/workspaces", timeout=30).json()["workspaces"]
        return {ws["workspace_id"]: (ws, httpx.get(f"{url}/v1/workspaces/{ws['workspace_id']}/experiences",
                                                   timeout=30).json()) for ws in workspaces}

    before = pool()
    for bad_value, body in (("5", '{"role": "assistant", "content": "hi", "tool_calls": 5}'),
                            ('"a call"', '{"role": "assistant", "content": "hi", "tool_calls": "a call"}'),
                            ("[5]", '{"role": "assistant", "content": "hi", "tool_calls": [5]}')):
        refused = post(experience_manager, "/summary_task_memory",
                       f'{{"workspace_id": "reme_types", "trajectories": [{good}, {{"messages": [{body}]}}]}}')
        field = "body.trajectories.1.messages.0.tool_calls" + (".0" if bad_value == "[5]" else "")
        assert_names_field(refused, field)
        assert refused.json()["success"] is False, bad_value
    assert "reme_types" in before and before["reme_types"][1]["total"] == 1
    assert pool() == before
    # The ReMe retrieval route takes the same messages, typed the same way.
    retrieve = post(experience_manager, "/retrieve_task_memory",
                    '{"workspace_id": "reme_types", "messages": [{"role": "user", "content": "x", "tool_calls": 5}]}')
    assert_names_field(retrieve, "body.messages.0.tool_calls")


def test_experience_manager_summary_inputs(experience_manager):
    surrogate = post(experience_manager, "/summary_task_memory",
                     f'{{"trajectories": [{{"messages": [{{"role": "user", "content": "{SURROGATE}"}}]}}]}}')
    assert_names_field(surrogate, "body.trajectories.0.messages.0.content")
    extra = post(experience_manager, "/summary_task_memory",
                 f'{{"trajectories": [{{"messages": [{{"role": "user", "content": "a"}}]}}], "n": {BIG}}}')
    assert_names_field(extra, "body.n")


def test_judge_surrogate_in_trajectory_id(judge):
    response = post(judge, "/v1/judge", f'{{"trajectories": [{{"trajectory_id": "{SURROGATE}", "steps": '
                                         '[{"action": "a"}], "outcome": 1.0}]}')
    assert_names_field(response, "body.trajectories.0.trajectory_id")


def test_llm_server_surrogate_in_chat_content(llm_server):
    response = post(llm_server, "/v1/chat/completions",
                    f'{{"model": "tiny", "messages": [{{"role": "user", "content": "{SURROGATE}"}}]}}')
    assert_names_field(response, "body.messages.0.content")


def test_nesting_and_non_finite_numbers(llm_server):
    deep = post(llm_server, "/v1/chat/completions", '{"model": "tiny", "x": ' + "[" * 200 + "]" * 200 + "}")
    assert deep.status_code == 422 and "nesting deeper than 64" in deep.json()["error"]["message"]
    nan = post(llm_server, "/v1/chat/completions",
               '{"model": "tiny", "temperature": NaN, "messages": [{"role": "user", "content": "a"}]}')
    assert_names_field(nan, "body.temperature")
