"""The LLM summarization path: facets, strict JSON, validation, one retry, fallback, merge band.

The summarizer LLM is a hosted API we cannot run here, so a small fake OpenAI-compatible server
stands in for it (test-only); everything else (service, Qdrant, MiniLM) is real.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.experience_manager.conftest import chat_trajectory, write_conf
from tests.helpers import run_service

pytestmark = pytest.mark.slow

ITEM = {"tags": ["flights"], "tools_used": ["search_flight"], "confidence": 0.9}
MERGED = {"same": True, "when_to_use": "When a weather lookup needs the coordinates of a place",
          "experience": "Geocode the place first, then request the forecast with its latitude and longitude."}


def _answer(prompt: str, retry_note: str | None) -> str:
    if "Do A and B give the same advice" in prompt:
        return json.dumps(MERGED)
    task = re.search(r"Task: (.*)", prompt).group(1)
    facet = ("success" if "successful attempt" in prompt else "failure" if "failed attempt" in prompt
             else "comparative")
    if task.startswith("BAD"):
        return "Sorry, I can only answer in prose."
    if task.startswith("RETRY") and retry_note is None:
        return json.dumps([{"when_to_use": "When asked to do this", "experience": task, **ITEM}])  # a restatement
    if task.startswith("MERGE"):
        when = ("When the weather tool needs coordinates for a city" if task.startswith("MERGE1")
                else "When looking up a forecast requires the latitude and longitude of a place")
        return "```json\n" + json.dumps([{"when_to_use": when, "experience": "Call geocode before get_forecast; "
                                          "the forecast tool rejects city names.", **ITEM}]) + "\n```"
    advice = {"success": "Search flights first, then book with a flight id taken from the search results.",
              "failure": "Never pass a guessed flight id to book_ticket; it fails with unknown flight id.",
              "comparative": "The better attempt searched before booking; the worse one booked a made-up id."}
    when = {"success": "When a user asks to book a flight between two cities",
            "failure": "When book_ticket answers that the flight id is unknown",
            "comparative": "When choosing the order of tool calls in a reservation workflow"}
    return json.dumps([{"when_to_use": when[facet], "experience": advice[facet], **ITEM}])


class FakeLLM(BaseHTTPRequestHandler):
    calls: list[list[dict]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server API)
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        FakeLLM.calls.append(body["messages"])
        retry_note = body["messages"][-1]["content"] if len(body["messages"]) > 1 else None
        content = _answer(body["messages"][0]["content"], retry_note)
        data = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                        "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 10, "completion_tokens": 10}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeLLM)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    root = tmp_path_factory.mktemp("em_llm")
    conf = write_conf(root / "conf.yaml", {"summarizer": {
        "base_url": f"http://127.0.0.1:{server.server_address[1]}/v1", "model": "fake-summarizer", "max_retries": 0}})
    try:
        with run_service("experience_manager", ["--store", str(root / "store"), "--conf", conf]) as svc:
            with httpx.Client(base_url=svc.url, timeout=60) as client:
                yield client
    finally:
        server.shutdown()


def _group(task_id: str, query: str) -> list[dict]:
    return [chat_trajectory(task_id, query, [("search_flight", {"origin": "A"}), ("book_ticket", {"id": "F1"})], 1.0),
            chat_trajectory(task_id, query, [("book_ticket", {"id": "F9"})], 0.0, error="Error: unknown flight id")]


def test_three_facets_give_validated_items(http):
    body = http.post("/v1/workspaces/llm/summarize", json={"trajectories": _group("good", "GOOD book a flight")}).json()
    assert body["mode_used"] == "llm" and body["errors"] == []
    kinds = sorted(e["kind"] for e in body["experiences"])
    assert kinds == ["comparative", "failure", "success"]
    assert all(e["provenance"]["author"] == "llm:fake-summarizer" and e["quality"] == 0.9 for e in body["experiences"])


def test_invalid_answer_is_retried_once_with_the_reason(http):
    FakeLLM.calls.clear()
    body = http.post("/v1/workspaces/llm_retry/summarize", json={"trajectories": [
        chat_trajectory("retry", "RETRY book a flight to Oslo", [("search_flight", {})], 1.0)]}).json()
    assert body["mode_used"] == "llm" and len(body["created"]) == 1
    retries = [c for c in FakeLLM.calls if len(c) == 3]
    assert len(retries) == 1 and "only restates the task" in retries[0][2]["content"]


def test_unusable_llm_falls_back_to_a_case_and_reports_errors(http):
    reply = http.post("/v1/workspaces/llm/summarize", json={"trajectories": _group("bad", "BAD book a flight")})
    assert reply.status_code == 200
    body = reply.json()
    assert body["mode_used"] == "heuristic" and [e["kind"] for e in body["experiences"]] == ["case"]
    assert any("not valid JSON" in e for e in body["errors"])
    assert any("used a heuristic case" in e for e in body["errors"])


def test_merge_band_asks_the_llm_and_merges(http):
    first = http.post("/v1/workspaces/merge/summarize", json={"trajectories": [
        chat_trajectory("m1", "MERGE1 weather in Oslo", [("geocode", {}), ("get_forecast", {})], 1.0)]}).json()
    second = http.post("/v1/workspaces/merge/summarize", json={"trajectories": [
        chat_trajectory("m2", "MERGE2 forecast for Rome", [("geocode", {}), ("get_forecast", {})], 1.0)]}).json()
    assert second["created"] == [] and second["merged"][0]["reason"] == "llm_merge"
    assert second["merged"][0]["into"] == first["created"][0]
    stored = http.get(f"/v1/workspaces/merge/experiences/{first['created'][0]}").json()
    assert stored["when_to_use"] == MERGED["when_to_use"] and stored["support"] == 2
    assert stored["provenance"]["task_ids"] == ["m1", "m2"]
