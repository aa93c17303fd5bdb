"""A small AgentEvolver-protocol env server with one deliberate fault, to test the conformance kit.

`python -m tests.env_service.conformance_faulty_server --port P --fault NAME` serves a counting
environment `counter` (three steps to the end, score = steps/3) on the AgentEvolver routes plus a
`GET /v1/instances` listing. With `--fault none` it conforms; each other fault breaks one rule:

- wrong_shape: a step answers two messages (the contract is exactly one).
- leak: release says success but keeps the instance alive (still listed, still answering).
- no_404: an unknown instance gets a 500 with a traceback, not a not-found error.
- hang: the second step of every instance hangs for --hang-s seconds.
- eval_range: evaluate answers 1.5.
- no_query: create ignores `params.query` (a synthetic task's question never reaches the episode).
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

FAULTS = ("none", "wrong_shape", "leak", "no_404", "hang", "eval_range", "no_query")
TASKS = {"train": ["c0", "c1", "c2"], "validation": ["c3"], "test": ["c4"]}


def build_app(fault: str, hang_s: float) -> FastAPI:
    app = FastAPI()
    live: dict[str, dict[str, Any]] = {}

    def fail(status: int, message: str) -> JSONResponse:
        return JSONResponse({"success": False, "data": None, "message": message}, status_code=status)

    def unknown(instance_id: str | None) -> JSONResponse:
        if fault == "no_404":
            return JSONResponse({"detail": f"Traceback (most recent call last):\n  KeyError: {instance_id!r}"},
                                status_code=500)
        return fail(404, f"unknown instance {instance_id!r}")

    async def body_of(request: Request) -> dict[str, Any] | JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return fail(422, "the body is not valid JSON")
        return body if isinstance(body, dict) else fail(422, "the body must be an object")

    async def counter_body(request: Request) -> dict[str, Any] | JSONResponse:
        """The body of a call about this server's one env_type, or the error answer."""
        body = await body_of(request)
        if isinstance(body, JSONResponse) or body.get("env_type") == "counter":
            return body
        return fail(404, f"unknown env_type {body.get('env_type')!r}")

    async def instance_of(request: Request) -> dict[str, Any] | JSONResponse:
        """The live instance the body names, or the error answer."""
        body = await body_of(request)
        if isinstance(body, JSONResponse):
            return body
        instance = live.get(body.get("instance_id"))
        return unknown(body.get("instance_id")) if instance is None else instance

    @app.get("/healthz")
    async def healthz() -> str:
        return "OK"

    @app.get("/v1/instances")
    async def instances() -> dict[str, Any]:
        return {"stats": {"live": len(live)}, "instances": [{"instance_id": i} for i in live]}

    @app.post("/get_env_profile")
    async def profile(request: Request) -> Any:
        body = await counter_body(request)
        if isinstance(body, JSONResponse):
            return body
        return {"success": True, "data": TASKS[body.get("params", {}).get("split", "train")]}

    @app.post("/get_info")
    async def info(request: Request) -> Any:
        return {"success": True, "data": "Say anything; each step counts one."}

    @app.post("/create")
    async def create(request: Request) -> Any:
        body = await counter_body(request)
        if isinstance(body, JSONResponse):
            return body
        if body.get("task_id") not in sum(TASKS.values(), []):
            return fail(404, f"unknown task {body.get('task_id')!r}")
        instance_id = body.get("instance_id") or f"exp_{uuid.uuid4().hex[:8]}"
        live[instance_id] = {"count": 0}
        query = (body.get("params") or {}).get("query")
        user = query if query and fault != "no_query" else "Start."
        state = [{"role": "system", "content": "Count to three."}, {"role": "user", "content": user}]
        return {"success": True, "data": {"state": state, "info": {"instance_id": instance_id}}}

    @app.post("/step")
    async def step(request: Request) -> Any:
        instance = await instance_of(request)
        if isinstance(instance, JSONResponse):
            return instance
        instance["count"] += 1
        if fault == "hang" and instance["count"] == 2:
            await asyncio.sleep(hang_s)
        message = {"role": "user", "content": f"count={instance['count']}"}
        state = [message, dict(message)] if fault == "wrong_shape" else [message]
        return {"success": True, "data": {"state": state, "reward": 0.0, "is_terminated": instance["count"] >= 3,
                                          "info": {}}}

    @app.post("/evaluate")
    async def evaluate(request: Request) -> Any:
        instance = await instance_of(request)
        if isinstance(instance, JSONResponse):
            return instance
        return {"success": True, "data": 1.5 if fault == "eval_range" else min(1.0, instance["count"] / 3)}

    @app.post("/release")
    async def release(request: Request) -> Any:
        body = await body_of(request)
        if isinstance(body, JSONResponse):
            return body
        instance_id = body.get("instance_id")
        if fault == "leak":
            return {"success": instance_id in live, "data": None}
        return {"success": live.pop(instance_id, None) is not None, "data": None}

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fault", choices=FAULTS, default="none")
    parser.add_argument("--hang-s", type=float, default=5.0)
    args = parser.parse_args()
    uvicorn.run(build_app(args.fault, args.hang_s), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
