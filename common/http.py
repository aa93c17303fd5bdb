"""A typed async HTTP client base for the per-service clients, with retries on transient failures."""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any, TypeVar

import httpx
from loguru import logger
from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

RETRY_STATUS = frozenset({429, 502, 503, 504})
RETRY_EXCEPTIONS = (httpx.ConnectError, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout,
                    httpx.RemoteProtocolError, httpx.ConnectTimeout)


class ServiceCallError(RuntimeError):
    """A call to one of our services failed; carries the service's structured error when it sent one."""

    def __init__(self, url: str, status: int | None, code: str, message: str, details: Any = None):
        where = f"{url} -> {status}" if status else url
        super().__init__(f"{where}: {code}: {message}")
        self.url, self.status, self.code, self.message, self.details = url, status, code, message, details


def backoff_delay(attempt: int, base: float, cap: float = 10.0) -> float:
    """Exponential backoff with full jitter."""
    return random.uniform(0, min(cap, base * (2**attempt)))


class ServiceClient:
    """Base for typed clients: JSON in/out, bearer token, retries with backoff and jitter.

    Retries connection errors, timeouts, 429 and 502-504. POSTs are retried only when the caller
    says they are safe (`idempotent=True`), so a create is never silently done twice.
    """

    def __init__(self, base_url: str, *, token: str | None = None, timeout: float = 60.0, retries: int = 3,
                 backoff: float = 0.2, max_connections: int = 256) -> None:
        self.base_url = base_url.rstrip("/")
        token = token if token is not None else os.environ.get("EVOLVER_API_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.retries, self.backoff = retries, backoff
        self._client = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=timeout,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def request(self, method: str, path: str, *, json: Any = None, params: dict | None = None,
                      model: type[M] | None = None, idempotent: bool | None = None,
                      timeout: float | None = None) -> Any:
        idempotent = method.upper() in ("GET", "HEAD", "PUT", "DELETE") if idempotent is None else idempotent
        attempts = 1 + (self.retries if idempotent else 0)
        url = f"{self.base_url}{path}"
        kwargs: dict[str, Any] = {"json": json, "params": params}
        if timeout is not None:
            kwargs["timeout"] = timeout
        for attempt in range(attempts):
            try:
                response = await self._client.request(method, path, **kwargs)
            except RETRY_EXCEPTIONS as exc:
                if attempt + 1 >= attempts:
                    raise ServiceCallError(url, None, "unreachable", f"{type(exc).__name__}: {exc}") from exc
                await asyncio.sleep(backoff_delay(attempt, self.backoff))
                continue
            if response.status_code in RETRY_STATUS and attempt + 1 < attempts:
                retry_after = response.headers.get("retry-after")
                delay = float(retry_after) if retry_after and retry_after.replace(".", "", 1).isdigit() \
                    else backoff_delay(attempt, self.backoff)
                logger.debug("{} {} -> {}; retrying in {:.2f}s", method, url, response.status_code, delay)
                await asyncio.sleep(delay)
                continue
            return self._decode(url, response, model)
        raise AssertionError("unreachable")

    @staticmethod
    def _decode(url: str, response: httpx.Response, model: type[M] | None) -> Any:
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = None
            if response.is_success:
                raise ServiceCallError(url, response.status_code, "bad_response",
                                       f"expected JSON, got {response.text[:200]!r}") from None
        if not response.is_success:
            err = body.get("error") if isinstance(body, dict) else None
            if isinstance(err, dict):
                raise ServiceCallError(url, response.status_code, err.get("code", "error"),
                                       err.get("message", ""), err.get("details"))
            raise ServiceCallError(url, response.status_code, "http_error", response.text[:300])
        return model.model_validate(body) if model is not None else body

    async def get(self, path: str, **kw: Any) -> Any:
        return await self.request("GET", path, **kw)

    async def post(self, path: str, json: Any = None, **kw: Any) -> Any:
        return await self.request("POST", path, json=json, **kw)

    async def delete(self, path: str, **kw: Any) -> Any:
        return await self.request("DELETE", path, **kw)

    async def healthy(self) -> bool:
        try:
            response = await self._client.get("/healthz", timeout=5)
            return response.status_code == 200
        except httpx.HTTPError:
            return False
