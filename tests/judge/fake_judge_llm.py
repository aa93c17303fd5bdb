"""A test double of a hosted judge LLM: an OpenAI-compatible /v1/chat/completions on a free port.

Allowed only in tests: it stands in for a hosted API we cannot call here. It answers from the prompt
itself: step i is GOOD when its action contains the word "useful", else BAD. A `[mode=...]` tag in
the task text picks a behaviour: well (default), one_based, partial, garbage_then_well, garbage,
error (HTTP 500), quote_reference (every analysis quotes the prompt's REFERENCE SOLUTION section, as a
judge may). Like some hosted APIs, it has no structured outputs: a `response_format` gets a 400.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.helpers import free_port

_STEP = re.compile(r">>> EVAL-STEP (\d+) <<<\n<\|ACTION\|>\n(.*?)\n<\|END\|>", re.DOTALL)
_MODE = re.compile(r"\[mode=(\w+)\]")
_REFERENCE = re.compile(r"### REFERENCE SOLUTION[^\n]*\n(.*?)\n\n### TRAJECTORY", re.DOTALL)


def _judgments(steps: list[tuple[int, str]], first: int = 0, only: int | None = None, quote: str = "") -> str:
    lines = []
    for index, action in steps[:only]:
        label = "GOOD" if "useful" in action else "BAD"
        said = f"the reference says {quote}" if quote else f"the step did \"{action[:20]}\""
        lines += [f"Step {index + first} Analysis: {said}.", f"Step {index + first} Judgment: {label}"]
    return "\n".join(lines)


def build_app(calls: list[dict]) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        if body.get("response_format"):
            return JSONResponse({"error": {"message": "response_format is not supported by this model"}},
                                status_code=400)
        calls.append(body)
        messages = body["messages"]
        prompt = messages[1]["content"]
        mode_match = _MODE.search(prompt)
        mode = mode_match.group(1) if mode_match else "well"
        steps = [(int(i), action) for i, action in _STEP.findall(prompt)]
        is_retry = len(messages) > 2
        if mode == "error":
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=500)
        if mode == "garbage" or (mode == "garbage_then_well" and not is_retry):
            text = "I think the agent did fine overall. GOOD/BAD depends on the context."
        elif mode == "one_based":
            text = _judgments(steps, first=1)
        elif mode == "partial":
            text = _judgments(steps, only=1)
        elif mode == "quote_reference":
            found = _REFERENCE.search(prompt)
            text = _judgments(steps, quote=" ".join(found.group(1).split()) if found else "nothing")
        else:
            text = _judgments(steps)
        return {"id": "fake", "object": "chat.completion", "model": body.get("model"),
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(text) // 4}}

    return app


@contextmanager
def fake_judge_llm() -> Iterator[tuple[str, list[dict]]]:
    """Yield (base_url ending in /v1, the list of request bodies received)."""
    calls: list[dict] = []
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(calls), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise TimeoutError("fake judge LLM did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1", calls
    finally:
        server.should_exit = True
        thread.join(timeout=10)
