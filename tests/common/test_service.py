"""The service base over real HTTP: errors, size limit, auth, metrics, health."""

import httpx
import pytest
from pydantic import BaseModel

from common.service import ServiceError, create_app
from tests.helpers import InProcessServer


class Item(BaseModel):
    name: str
    count: int


def build_app(token=None, ready=lambda: True):
    app = create_app("demo", ready=ready, max_body_bytes=1024, token=token)

    @app.post("/items")
    async def create_item(item: Item) -> dict:
        return {"name": item.name, "count": item.count}

    @app.get("/missing/{key}")
    async def missing(key: str) -> dict:
        raise ServiceError(404, "unknown_key", f"no key {key!r}; known keys: a, b")

    @app.get("/boom")
    async def boom() -> dict:
        raise RuntimeError("secret internal detail")

    return app


@pytest.fixture(scope="module")
def server():
    with InProcessServer(build_app()) as srv:
        yield srv


def test_bad_body_is_422_with_field_path(server):
    r = httpx.post(f"{server.url}/items", json={"name": "x", "count": "many"})
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "validation_error"
    assert any(p["field"] == "body.count" for p in err["details"])
    assert "body.count" in err["message"]


def test_malformed_json_is_422(server):
    r = httpx.post(f"{server.url}/items", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert r.json()["error"]["code"] == "validation_error"


def test_oversized_body_is_413(server):
    r = httpx.post(f"{server.url}/items", json={"name": "x" * 5000, "count": 1})
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "payload_too_large"


def test_oversized_chunked_body_is_413(server):
    def chunks():
        for _ in range(10):
            yield b"x" * 500

    r = httpx.post(f"{server.url}/items", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_service_error_and_unknown_route(server):
    r = httpx.get(f"{server.url}/missing/zz")
    assert r.status_code == 404
    assert r.json() == {"error": {"code": "unknown_key", "message": "no key 'zz'; known keys: a, b", "details": None}}
    r = httpx.get(f"{server.url}/nope")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"


def test_unexpected_error_hides_the_traceback(server):
    r = httpx.get(f"{server.url}/boom")
    assert r.status_code == 500
    body = r.json()
    assert body["error"]["code"] == "internal_error"
    assert "secret internal detail" not in r.text and "Traceback" not in r.text
    assert r.headers["x-request-id"] in body["error"]["message"]


def test_metrics_count_requests(server):
    for _ in range(3):
        httpx.post(f"{server.url}/items", json={"name": "a", "count": 1})
    text = httpx.get(f"{server.url}/metrics").text
    line = next(ln for ln in text.splitlines()
                if ln.startswith("evolver_http_requests_total") and 'route="/items"' in ln and 'status="200"' in ln)
    assert float(line.rsplit(" ", 1)[1]) >= 3


def test_request_id_is_echoed(server):
    r = httpx.get(f"{server.url}/healthz", headers={"x-request-id": "abc123"})
    assert r.headers["x-request-id"] == "abc123"


def test_bearer_token_auth():
    with InProcessServer(build_app(token="s3cret")) as srv:
        assert httpx.get(f"{srv.url}/healthz").status_code == 200  # health stays open
        r = httpx.post(f"{srv.url}/items", json={"name": "a", "count": 1})
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        r = httpx.post(f"{srv.url}/items", json={"name": "a", "count": 1}, headers={"authorization": "Bearer wrong"})
        assert r.status_code == 401
        r = httpx.post(f"{srv.url}/items", json={"name": "a", "count": 1}, headers={"authorization": "Bearer s3cret"})
        assert r.status_code == 200


def test_token_from_environment(monkeypatch):
    monkeypatch.setenv("EVOLVER_API_TOKEN", "from-env")
    with InProcessServer(build_app()) as srv:
        assert httpx.get(f"{srv.url}/metrics").status_code == 401
        assert httpx.get(f"{srv.url}/metrics", headers={"authorization": "Bearer from-env"}).status_code == 200


def test_healthz_reflects_readiness():
    state = {"ready": False}
    with InProcessServer(build_app(ready=lambda: state["ready"])) as srv:
        assert httpx.get(f"{srv.url}/healthz").status_code == 503
        state["ready"] = True
        assert httpx.get(f"{srv.url}/healthz").status_code == 200


def test_error_renderer_changes_shape_on_chosen_paths():
    app = build_app()
    app.state.error_renderers.append(
        lambda path, status, code, message, details: {"success": False, "message": message}
        if path == "/items" else None)
    with InProcessServer(app) as srv:
        r = httpx.post(f"{srv.url}/items", json={"name": "x"})
        assert r.status_code == 422 and r.json()["success"] is False and "count" in r.json()["message"]
        assert "error" in httpx.get(f"{srv.url}/missing/q").json()
