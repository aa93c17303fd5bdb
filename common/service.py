"""The FastAPI app factory every service uses, and the shared service CLI.

Each app gets `GET /healthz` (200 only when ready), `GET /metrics` (Prometheus text), structured
errors `{"error": {"code", "message", "details"}}` (never a traceback), a request-size limit (413),
bearer-token auth from EVOLVER_API_TOKEN (401; /healthz stays open) and a request id on every log line.
The token is optional on a loopback address and required off it: `service_cli` refuses to start a service
bound elsewhere without one. The middleware is plain ASGI: it sits on the env-service hot path.
"""

from __future__ import annotations

import argparse
import hmac
import inspect
import os
import re
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from loguru import logger
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.addresses import is_loopback
from common.config import ConfigError, StrictModel, apply_flags, load_config, load_dotenv_file
from common.faults import disk_full_message, is_disk_full
from common.jsonguard import DEFAULT_MAX_DEPTH, find_unrepresentable, is_json_content
from common.logging import setup_logging

_SLASHES = re.compile(r"/{2,}")
OPEN_PATHS = frozenset({"/healthz", "/docs", "/openapi.json", "/docs/oauth2-redirect", "/redoc"})
DEFAULT_MAX_BODY = 16 * 1024 * 1024


class ServiceError(Exception):
    """An error a handler raises on purpose: becomes a structured JSON error with this status."""

    def __init__(self, status: int, code: str, message: str, details: Any = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.details, self.headers = status, code, message, details, headers


class ServiceSettings(StrictModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY, gt=0)
    log_level: str = "INFO"
    tls_certfile: str | None = Field(default=None, description=(
        "serve HTTPS with this PEM certificate (uvicorn's ssl_certfile); peers then use https:// URLs"))
    tls_keyfile: str | None = Field(default=None, description="the certificate's private key (uvicorn's ssl_keyfile)")


TOKEN_VARIABLE = "EVOLVER_API_TOKEN"


def missing_token_problem(name: str, host: str, environ: dict[str, str] | None = None) -> str | None:
    """Why service `name` must not listen on `host` as configured, or None: off loopback it needs a token."""
    environ = os.environ if environ is None else environ
    if is_loopback(host) or environ.get(TOKEN_VARIABLE):
        return None
    return (f"{name}: refusing to listen on {host or '0.0.0.0'} without a bearer token: anyone who can reach that "
            f"address could use the service. Set {TOKEN_VARIABLE} (in the environment or .env), e.g. "
            f"`export {TOKEN_VARIABLE}=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')`, and give "
            f"every peer the same value (the launcher generates one per run), or bind a loopback address "
            f"(--host 127.0.0.1)")


class ORJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


# A renderer turns (path, status, code, message, details) into a body, or None to use the default.
ErrorRenderer = Callable[[str, int, str, str, Any], dict | None]


class ErrorInfo(BaseModel):
    code: str
    message: str
    details: Any = None


class ErrorResponse(BaseModel):
    """Every 4xx a service sends (unless a compatible route keeps its protocol's own shape)."""

    error: ErrorInfo


def error_body(code: str, message: str, details: Any = None) -> dict:
    return {"error": {"code": code, "message": message, "details": details}}


def add_error_renderer(app: FastAPI, renderer: ErrorRenderer, paths: Iterable[str],
                       model: type[BaseModel]) -> None:
    """Render errors on `paths` with `renderer`, and document them in OpenAPI as `model`."""
    app.state.error_renderers.append(renderer)
    app.state.error_models.update(dict.fromkeys(paths, model))


def _document_errors(app: FastAPI) -> dict[str, Any]:
    """FastAPI's OpenAPI, with the 4xx bodies the services really send (not FastAPI's `detail` list)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = FastAPI.openapi(app)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in {ErrorResponse, *app.state.error_models.values()}:
        definition = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(definition.pop("$defs", {}))
        components[model.__name__] = definition
    for path, operations in schema.get("paths", {}).items():
        model = app.state.error_models.get(path, ErrorResponse)
        content = {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses["422"] = {"description": "Invalid request: the fields to fix are named", "content": content}
            responses["4XX"] = {"description": "Client error", "content": content}
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    app.openapi_schema = schema
    return schema


def _render_error(request: Request, status: int, code: str, message: str, details: Any = None,
                  headers: dict | None = None) -> Response:
    for renderer in getattr(request.app.state, "error_renderers", ()):
        body = renderer(request.url.path, status, code, message, details)
        if body is not None:
            return ORJSONResponse(body, status_code=status, headers=headers)
    return ORJSONResponse(error_body(code, message, details), status_code=status, headers=headers)


def _field_path(loc: Sequence[Any]) -> str:
    return ".".join(str(p) for p in loc)


class _Metrics:
    def __init__(self, service: str) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("evolver_http_requests", "HTTP requests served", ["route", "method", "status"],
                                registry=self.registry)
        self.latency = Histogram("evolver_http_request_seconds", "Request latency", ["route"],
                                 registry=self.registry,
                                 buckets=(0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.service = service


class _GuardMiddleware:
    """Request id, bearer auth, body-size limit and request metrics, as raw ASGI."""

    def __init__(self, app: ASGIApp, *, token: str | None, max_body: int, metrics: _Metrics,
                 renderers: list[ErrorRenderer], body_limits: dict[str, int] | None = None) -> None:
        self.app, self.token, self.max_body, self.metrics = app, token, max_body, metrics
        self.renderers = renderers
        self.body_limits = body_limits or {}
        self._expected = f"Bearer {token}".encode() if token else b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if "//" in path:
            # Clients that join a base URL ending in "/" with "/route" send "//route"
            # (AgentEvolver's env client does): route them as the single-slash path.
            path = scope["path"] = _SLASHES.sub("/", path)
        headers = dict(scope["headers"])
        request_id = headers.get(b"x-request-id", b"").decode("latin-1")[:64] or uuid.uuid4().hex[:12]
        scope.setdefault("state", {})["request_id"] = request_id
        start = time.perf_counter()
        status_holder = [500]
        started = [False]

        async def send_wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_holder[0] = message["status"]
                started[0] = True
                message.setdefault("headers", []).append((b"x-request-id", request_id.encode()))
            await send(message)

        with logger.contextualize(request_id=request_id):
            try:
                if self.token and path not in OPEN_PATHS:
                    got = headers.get(b"authorization", b"")
                    if not hmac.compare_digest(got, self._expected):
                        await self._reject(send_wrapped, path, 401, "unauthorized",
                                           "missing or wrong bearer token (set Authorization: Bearer $EVOLVER_API_TOKEN)",
                                           [(b"www-authenticate", b"Bearer")])
                        return
                length = headers.get(b"content-length")
                limit = self.body_limits.get(path, self.max_body)
                if length is not None and length.isdigit() and int(length) > limit:
                    await self._reject(send_wrapped, path, 413, "payload_too_large",
                                       f"request body of {int(length)} bytes exceeds the limit of {limit} bytes")
                    return
                chunked = length is None and b"chunked" in headers.get(b"transfer-encoding", b"")
                if chunked and path not in self.body_limits:
                    # No declared size: read up to the limit before the app sees anything, because
                    # FastAPI turns any error raised while it reads the body into a 400.
                    receive = await self._buffered(receive)
                    if receive is None:
                        await self._reject(send_wrapped, path, 413, "payload_too_large",
                                           f"request body exceeds the limit of {self.max_body} bytes")
                        return
                if (chunked or length not in (None, b"0")) and is_json_content(headers.get(b"content-type")):
                    body, receive = await self._read_body(receive)
                    problem = find_unrepresentable(body, DEFAULT_MAX_DEPTH)
                    if problem is not None:
                        field, why = problem
                        await self._send_json(send_wrapped, 422, self._body(
                            path, 422, "validation_error", f"invalid request: {field}: {why}",
                            [{"field": field, "message": why, "type": "json_value"}]))
                        return
                await self.app(scope, receive, send_wrapped)
            except Exception as exc:
                if is_disk_full(exc) and not started[0]:
                    message = (f"{disk_full_message(exc)}: nothing of this request was stored and what was stored "
                               f"before is kept; free space on that disk, then send the request again")
                    logger.error("{} {}: {}", scope.get("method"), path, message)
                    await self._send_json(send_wrapped, 507, self._body(
                        path, 507, "insufficient_storage", message, {"path": getattr(exc, "filename", None)}))
                    return
                # Unhandled: log the traceback here, answer without it (and with the request id).
                logger.exception("unhandled error in {} {}", scope.get("method"), path)
                if started[0]:
                    raise
                message = f"internal error while serving {path} (request id {request_id}; see the service log)"
                await self._send_json(send_wrapped, 500, self._body(path, 500, "internal_error", message, None))
            finally:
                route = scope.get("route")
                route_path = getattr(route, "path", None) or ("<unmatched>" if status_holder[0] == 404 else path)
                self.metrics.requests.labels(route_path, scope.get("method", ""), str(status_holder[0])).inc()
                self.metrics.latency.labels(route_path).observe(time.perf_counter() - start)

    def _body(self, path: str, status: int, code: str, message: str, details: Any) -> dict:
        return next((b for r in self.renderers if (b := r(path, status, code, message, details))),
                    error_body(code, message, details))

    @staticmethod
    async def _read_body(receive: Receive) -> tuple[bytes, Receive]:
        """The whole body (its size is already bounded) and a `receive` that replays it."""
        chunks: list[bytes] = []
        messages: list[Message] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        return b"".join(chunks), replay

    async def _buffered(self, receive: Receive) -> Receive | None:
        messages: list[Message] = []
        seen = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            seen += len(message.get("body", b""))
            if seen > self.max_body:
                return None
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        return replay

    async def _reject(self, send: Send, path: str, status: int, code: str, message: str,
                      extra_headers: list | None = None) -> None:
        # Through the renderers: a compatible route keeps its protocol's shape for 401 and 413 too.
        await self._send_json(send, status, self._body(path, status, code, message, None), extra_headers)

    @staticmethod
    async def _send_json(send: Send, status: int, payload: dict, extra_headers: list | None = None) -> None:
        body = orjson.dumps(payload)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers + (extra_headers or [])})
        await send({"type": "http.response.body", "body": body})


# True/False, or a string: the reason the service is not ready (a dependency that does not answer).
ReadyCheck = Callable[[], bool | str | Awaitable[bool | str]]


def create_app(
    name: str,
    *,
    version: str = "0.1.0",
    description: str = "",
    ready: ReadyCheck | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY,
    token: str | None = None,
    lifespan: Any = None,
    body_limits: dict[str, int] | None = None,
) -> FastAPI:
    """Build a FastAPI app with the shared routes, errors and middleware.

    `body_limits`: paths whose declared body may exceed `max_body_bytes` up to their own limit (a weights
    upload); a chunked body without a declared size is read by the route itself there.

    `token` defaults to EVOLVER_API_TOKEN from the environment; `ready` decides /healthz: a string it
    returns is the reason the service is not ready, answered as 503 `{"status": "unavailable", "reason"}`.
    """
    token = token if token is not None else (os.environ.get("EVOLVER_API_TOKEN") or None)
    app = FastAPI(title=f"evolver {name}", version=version, description=description,
                  default_response_class=ORJSONResponse, lifespan=lifespan)
    metrics = _Metrics(name)
    app.state.service_name = name
    app.state.metrics_registry = metrics.registry
    app.state.error_renderers = []
    app.state.error_models = {}
    app.openapi = lambda: _document_errors(app)  # type: ignore[method-assign]
    app.state.ready_check = ready

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> Response:
        if exc.status >= 500:
            logger.error("{} {}: {}", request.method, request.url.path, exc.message)
        return _render_error(request, exc.status, exc.code, exc.message, exc.details, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        problems = [{"field": _field_path(e["loc"]), "message": e["msg"], "type": e["type"]} for e in exc.errors()]
        summary = "; ".join(f"{p['field']}: {p['message']}" for p in problems[:5])
        return _render_error(request, 422, "validation_error", f"invalid request: {summary}", problems)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}.get(exc.status_code, "http_error")
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path}"
        return _render_error(request, exc.status_code, code, message, None, getattr(exc, "headers", None))

    @app.get("/healthz", tags=["service"])
    async def healthz() -> Response:
        check = app.state.ready_check
        result: bool | str = True
        if check is not None:
            result = check()
            result = await result if inspect.isawaitable(result) else result
        if isinstance(result, str):
            return ORJSONResponse({"status": "unavailable", "service": name, "reason": result}, status_code=503)
        body = {"status": "ok" if result else "starting", "service": name}
        return ORJSONResponse(body, status_code=200 if result else 503)

    @app.get("/metrics", tags=["service"], response_class=PlainTextResponse)
    async def metrics_route() -> Response:
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(_GuardMiddleware, token=token, max_body=max_body_bytes, metrics=metrics,
                       renderers=app.state.error_renderers, body_limits=body_limits)
    return app


def from_app_state(name: str) -> Callable[[Request], Awaitable[Any]]:
    """A route dependency answering `app.state.<name>`, the object a service's routers work on:
    `Engine = Annotated[ExperienceEngine, Depends(from_app_state("engine"))]`. Async, because FastAPI runs a
    plain function dependency on its thread pool, a hop on every request."""

    async def dependency(request: Request) -> Any:
        return getattr(request.app.state, name)

    return dependency


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind the service's port now, before building an app that starts helper servers of its own.

    ScienceWorld's Java gateway and Ray pick free ports while the app is built; without this,
    one of them can take the port the service was asked to listen on.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # listening, so no SO_REUSEADDR socket elsewhere can bind the same port
    except OSError as exc:
        sock.close()
        raise SystemExit(f"cannot listen on {host}:{port}: {exc.strerror}; choose another port "
                         "(--port, or `port:` in the service's YAML section)") from exc
    return sock


def run_app(app: FastAPI, host: str, port: int, log_level: str = "info",
            sock: socket.socket | None = None, *, tls_certfile: str | None = None,
            tls_keyfile: str | None = None) -> None:
    """Serve with uvicorn; uvloop and httptools when installed (uvicorn[standard]).

    `sock` is a socket from `reserve_port`; without one, uvicorn binds host:port itself. With
    `tls_certfile` (and its key) uvicorn serves HTTPS.
    """
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level.lower(), access_log=False,
                            timeout_keep_alive=30, log_config=None, ssl_certfile=tls_certfile,
                            ssl_keyfile=tls_keyfile)
    uvicorn.Server(config).run(sockets=[sock] if sock is not None else None)


def service_cli(
    name: str,
    settings_model: type[ServiceSettings],
    section: str,
    description: str,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    argv: Sequence[str] | None = None,
) -> tuple[ServiceSettings, argparse.Namespace]:
    """Parse `--host --port --conf` (+ service flags) into settings: flags > YAML section > defaults."""
    parser = argparse.ArgumentParser(prog=f"python -m {name}", description=description)
    parser.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port to bind")
    parser.add_argument("--conf", default=None, help=f"run YAML; this service reads its `{section}` section")
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING or ERROR")
    if add_arguments:
        add_arguments(parser)
    args = parser.parse_args(argv)
    load_dotenv_file()
    try:
        settings = load_config(settings_model, args.conf, section=section)
        flags = {k: v for k, v in vars(args).items() if k in settings_model.model_fields and k != "conf"}
        settings = apply_flags(settings, **flags)
    except ConfigError as exc:
        parser.exit(2, f"{name}: {exc}\n")
    problem = missing_token_problem(name, settings.host)
    if problem is not None:
        parser.exit(2, problem + "\n")
    if settings.tls_keyfile and not settings.tls_certfile:
        parser.exit(2, f"{name}: tls_keyfile is set without tls_certfile; give both, or neither\n")
    setup_logging(name, settings.log_level)
    return settings, args
