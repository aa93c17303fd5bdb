"""The OpenAI-compatible LLM client and the service client base, against real HTTP servers.

The chat server here is a test double for a hosted LLM API (which we cannot run here): it lets
the tests script failures (429, 500, malformed JSON) that a real model server would not produce.
"""

import asyncio

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from common.http import ServiceCallError, ServiceClient
from common.llm import USAGE_BY_ROLE, LLMClient, LLMError, LLMRoleConfig
from common.service import ServiceError, create_app
from tests.helpers import InProcessServer


def fake_openai_api():
    app = FastAPI()
    app.state.script = []  # responses to give, in order; then a normal completion
    app.state.calls = 0
    app.state.auth = []
    app.state.in_flight = 0
    app.state.max_in_flight = 0

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        app.state.calls += 1
        app.state.auth.append(request.headers.get("authorization"))
        body = await request.json()
        if app.state.script:
            kind = app.state.script.pop(0)
            if kind == "429":
                return JSONResponse({"error": "slow down"}, status_code=429)
            if kind == "500":
                return JSONResponse({"error": "boom"}, status_code=500)
            if kind == "html":
                return PlainTextResponse("<html>gateway</html>")
            if kind == "nochoices":
                return JSONResponse({"id": "x"})
        app.state.in_flight += 1
        app.state.max_in_flight = max(app.state.max_in_flight, app.state.in_flight)
        await asyncio.sleep(0.05)
        app.state.in_flight -= 1
        text = f"echo: {body['messages'][-1]['content']}"
        return {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3}}

    return app


@pytest.fixture(scope="module")
def api():
    app = fake_openai_api()
    with InProcessServer(app) as srv:
        srv.app = app
        yield srv


def make_client(api, role, **kw):
    return LLMClient(role, LLMRoleConfig(base_url=f"{api.url}/v1", model="m", max_retries=3, **kw))


async def test_chat_counts_usage_and_sends_key(api, monkeypatch):
    monkeypatch.setenv("MY_KEY", "k-1")
    client = make_client(api, "judge-a", api_key_env="MY_KEY")
    result = await client.chat([{"role": "user", "content": "hi"}], temperature=0)
    assert result.text == "echo: hi"
    assert USAGE_BY_ROLE["judge-a"]["prompt_tokens"] == 7 and USAGE_BY_ROLE["judge-a"]["completion_tokens"] == 3
    assert api.app.state.auth[-1] == "Bearer k-1"
    await client.aclose()


async def test_retries_429_and_5xx(api):
    api.app.state.script = ["429", "500"]
    client = make_client(api, "r")
    before = api.app.state.calls
    result = await client.chat([{"role": "user", "content": "x"}])
    assert result.text == "echo: x" and api.app.state.calls - before == 3
    await client.aclose()


async def test_malformed_response_names_endpoint(api):
    client = make_client(api, "bad")
    api.app.state.script = ["html"]
    with pytest.raises(LLMError, match=r"role 'bad' at http://127.0.0.1:\d+/v1/chat/completions: non-JSON"):
        await client.chat([{"role": "user", "content": "x"}])
    api.app.state.script = ["nochoices"]
    with pytest.raises(LLMError, match="malformed completion"):
        await client.chat([{"role": "user", "content": "x"}])
    await client.aclose()


async def test_missing_key_env_is_a_clear_error():
    with pytest.raises(LLMError, match="NOT_SET_ANYWHERE is not set"):
        LLMClient("x", LLMRoleConfig(base_url="http://127.0.0.1:1/v1", model="m", api_key_env="NOT_SET_ANYWHERE"))


async def test_unreachable_endpoint():
    client = LLMClient("down", LLMRoleConfig(base_url="http://127.0.0.1:1/v1", model="m", max_retries=1))
    with pytest.raises(LLMError, match="unreachable after 2 tries"):
        await client.chat([{"role": "user", "content": "x"}])
    await client.aclose()


async def test_concurrency_limit_and_cache(api, tmp_path):
    client = make_client(api, "c", concurrency=2, cache_dir=str(tmp_path))
    api.app.state.max_in_flight = 0
    await asyncio.gather(*(client.chat([{"role": "user", "content": f"q{i}"}]) for i in range(6)))
    assert api.app.state.max_in_flight == 2
    calls = api.app.state.calls
    again = await client.chat([{"role": "user", "content": "q0"}])
    assert again.cached and again.text == "echo: q0" and api.app.state.calls == calls
    assert client.usage["cache_hits"] == 1
    await client.aclose()


def flaky_service():
    app = create_app("flaky")
    state = {"n": 0}

    @app.get("/v1/thing")
    async def thing():
        state["n"] += 1
        if state["n"] < 3:
            raise ServiceError(503, "busy", "try later", headers={"Retry-After": "0"})
        return {"n": state["n"]}

    @app.post("/v1/thing")
    async def make_thing():
        state["n"] += 1
        raise ServiceError(503, "busy", "try later")

    @app.get("/v1/missing")
    async def missing():
        raise ServiceError(404, "unknown_thing", "no such thing")

    return app, state


async def test_service_client_retries_idempotent_calls_only():
    app, state = flaky_service()
    with InProcessServer(app) as srv:
        async with ServiceClient(srv.url, backoff=0.01) as client:
            assert (await client.get("/v1/thing")) == {"n": 3}
            state["n"] = 0
            with pytest.raises(ServiceCallError) as err:
                await client.post("/v1/thing", json={})
            assert state["n"] == 1 and err.value.status == 503  # a POST is not repeated
            with pytest.raises(ServiceCallError) as err:
                await client.get("/v1/missing")
            assert err.value.code == "unknown_thing" and err.value.status == 404
            assert await client.healthy()
