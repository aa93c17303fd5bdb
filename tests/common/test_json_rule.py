"""The service base's one JSON rule, before any handler runs: what JSON may hold, and `//` paths."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from common.jsonguard import find_unrepresentable, is_json_content
from common.service import create_app
from tests.helpers import InProcessServer


@pytest.fixture(scope="module")
def served():
    app = create_app("demo", max_body_bytes=65536)
    seen: list[Any] = []

    @app.post("/echo")
    async def echo(body: dict[str, Any]) -> dict:
        seen.append(body)
        return body

    with InProcessServer(app) as srv:
        yield srv, seen


@pytest.mark.parametrize(("body", "field", "why"), [
    (b'{"a": {"seed": 18446744073709551616}}', "body.a.seed", "64-bit range"),
    (b'{"a": [1, -9223372036854775809]}', "body.a.1", "64-bit range"),
    (b'{"t": "x\\udc00y"}', "body.t", "lone UTF-16 surrogate"),
    (b'{"t": ["ok", "\\ud800"]}', "body.t.1", "lone UTF-16 surrogate"),
    (b'{"x\\udfffx": 1}', "body", "a key holds a lone UTF-16 surrogate"),
    (b'{"f": NaN}', "body.f", "not a JSON number"),
    (b'{"f": -Infinity}', "body.f", "not a JSON number"),
    (b'{"f": 1e999}', "body.f", "not a JSON number"),
    (b'{"d": ' + b"[" * 70 + b"]" * 70 + b"}", "body.d" + ".0" * 63, "nesting deeper than 64"),
    (b"[" * 5000 + b"]" * 5000, "body", "nesting deeper than 64"),  # beyond Python's recursion limit
])
def test_refused_with_a_422_naming_the_field_and_the_handler_never_runs(served, body, field, why):
    srv, seen = served
    before = len(seen)
    r = httpx.post(f"{srv.url}/echo", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["details"][0]["field"] == field and why in error["details"][0]["message"]
    assert f"{field}: " in error["message"]
    assert len(seen) == before


@pytest.mark.parametrize("body", [
    b'{"big": 18446744073709551615, "small": -9223372036854775808, "s": "\\ud83d\\ude00 \\u00e9", "n": 1e308}',
    b'{"digits": "123456789012345678901234567890", "word": "NaN and Infinity are fine in strings"}',
])
def test_what_fits_passes_unchanged(served, body):
    srv, seen = served
    r = httpx.post(f"{srv.url}/echo", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json() == seen[-1]


def test_chunked_bodies_are_checked_too(served):
    srv, seen = served
    before = len(seen)

    def chunks():
        yield b'{"a": '
        yield b"18446744073709551616}"

    r = httpx.post(f"{srv.url}/echo", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["details"][0]["field"] == "body.a"
    assert len(seen) == before


def test_double_slashes_route_as_one(served):
    srv, _ = served
    r = httpx.post(f"{srv.url}//echo", json={"k": 1})
    assert r.status_code == 200 and r.json() == {"k": 1}


def test_openapi_documents_the_error_bodies_sent(served):
    srv, _ = served
    document = httpx.get(f"{srv.url}/openapi.json").json()
    responses = document["paths"]["/echo"]["post"]["responses"]
    for status in ("422", "4XX"):
        assert responses[status]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorResponse"}
    assert set(document["components"]["schemas"]["ErrorResponse"]["required"]) == {"error"}
    assert "HTTPValidationError" not in document["components"]["schemas"]


def test_helpers_directly():
    assert find_unrepresentable(b'{"a": 1}') is None
    assert find_unrepresentable(b"{not json 99999999999999999999") is None  # FastAPI answers those
    assert is_json_content(None) and is_json_content(b"application/json; charset=utf-8")
    assert is_json_content(b"application/vnd.api+json") and not is_json_content(b"text/plain")
