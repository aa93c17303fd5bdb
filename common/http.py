"""A typed async HTTP client base for the per-service clients, with retries on transient failures."""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import httpx
from loguru import logger
from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

RETRY_STATUS = frozenset({429, 502, 503, 504})
RETRY_EXCEPTIONS = (httpx.ConnectError, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout,
                    httpx.RemoteProtocolError, httpx.ConnectTimeout, httpx.ReadError, httpx.WriteError)
# The request never reached the peer: retrying is safe whatever the method.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout)
# The peer went away while the request was in flight: it may have been applied, so only idempotent
# calls are retried (a SIGKILLed service drops its open connections with these).
CONNECTION_LOST = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
HEALTH_POLL_S = (0.2, 2.0)  # first and longest wait between /healthz probes during an outage


class ServiceCallError(RuntimeError):
    """A call to one of our services failed; carries the service's structured error when it sent one."""

    def __init__(self, url: str, status: int | None, code: str, message: str, details: Any = None):
        where = f"{url} -> {status}" if status else url
        super().__init__(f"{where}: {code}: {message}")
        self.url, self.status, self.code, self.message, self.details = url, status, code, message, details


class PeerUnavailable(ServiceCallError):
    """A peer stayed down past the caller's outage budget."""


@dataclass
class OutageCounters:
    outages: int = 0  # outages that began (a peer unreachable or answering 503)
    survived: int = 0  # outages that ended with the peer healthy again
    waited_s: float = 0.0  # seconds from each outage's first failure to the peer's first 200 on /healthz
    retried_calls: int = 0  # calls sent again after an outage
    gave_up: int = 0  # calls that failed after the outage budget

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def backoff_delay(attempt: int, base: float, cap: float = 10.0) -> float:
    """Exponential backoff with full jitter."""
    return random.uniform(0, min(cap, base * (2**attempt)))


class ServiceClient:
    """Base for typed clients: JSON in/out, bearer token, retries with backoff and jitter.

    Retries connection errors, timeouts, 429 and 502-504. POSTs are retried only when the caller
    says they are safe (`idempotent=True`), so a create is never silently done twice.

    With an outage budget (`outage_budget_s` > 0) a peer that is unreachable or answers 503 is an
    outage, not an error: the call waits, probing `/healthz` with backoff, and is sent again once the
    peer is healthy -- any call whose request never left (connection refused), idempotent calls also
    when the connection dropped mid-request. Past the budget it raises `PeerUnavailable`, naming
    the peer and where its log is. Concurrent calls that hit the same outage count it once.
    """

    def __init__(self, base_url: str, *, token: str | None = None, timeout: float = 60.0, retries: int = 3,
                 backoff: float = 0.2, max_connections: int = 256, peer: str | None = None,
                 outage_budget_s: float = 0.0, log_hint: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        token = token if token is not None else os.environ.get("EVOLVER_API_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.retries, self.backoff = retries, backoff
        self.peer = peer or self.base_url
        self.outage_budget_s, self.log_hint = outage_budget_s, log_hint
        self.outage_counters = OutageCounters()
        self._down_since: float | None = None
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
                      timeout: float | None = None, content: bytes | None = None,
                      content_type: str = "application/octet-stream") -> Any:
        """`content`: a raw body (sent as `content_type`) instead of `json`."""
        idempotent = method.upper() in ("GET", "HEAD", "PUT", "DELETE") if idempotent is None else idempotent
        attempts = 1 + (self.retries if idempotent else 0)
        url = f"{self.base_url}{path}"
        kwargs: dict[str, Any] = ({"content": content, "params": params, "headers": {"content-type": content_type}}
                                  if content is not None else {"json": json, "params": params})
        if timeout is not None:
            kwargs["timeout"] = timeout
        attempt = 0
        deadline: float | None = None  # the end of this call's outage budget, from its first outage failure
        while True:
            try:
                response = await self._client.request(method, path, **kwargs)
            except RETRY_EXCEPTIONS as exc:
                if self._is_outage(exc, idempotent):
                    deadline = deadline or time.monotonic() + self.outage_budget_s
                    await self._ride_out(url, f"{type(exc).__name__}: {exc}", deadline)
                    continue
                attempt += 1
                if attempt >= attempts:
                    raise ServiceCallError(url, None, "unreachable", f"{type(exc).__name__}: {exc}") from exc
                await asyncio.sleep(backoff_delay(attempt - 1, self.backoff))
                continue
            if response.status_code == 503 and self.outage_budget_s > 0:
                deadline = deadline or time.monotonic() + self.outage_budget_s
                await self._ride_out(url, f"503: {response.text[:200]}", deadline)
                continue
            self._outage_over()
            if response.status_code in RETRY_STATUS and attempt + 1 < attempts:
                retry_after = response.headers.get("retry-after")
                delay = float(retry_after) if retry_after and retry_after.replace(".", "", 1).isdigit() \
                    else backoff_delay(attempt, self.backoff)
                logger.debug("{} {} -> {}; retrying in {:.2f}s", method, url, response.status_code, delay)
                attempt += 1
                await asyncio.sleep(delay)
                continue
            return self._decode(url, response, model)

    def _is_outage(self, exc: Exception, idempotent: bool) -> bool:
        if self.outage_budget_s <= 0:
            return False
        return isinstance(exc, NOT_SENT) or (idempotent and isinstance(exc, CONNECTION_LOST))

    async def _ride_out(self, url: str, why: str, deadline: float) -> None:
        """Wait until the peer's /healthz answers 200 (then the caller sends again) or the deadline passes."""
        counters = self.outage_counters
        if self._down_since is None:
            self._down_since = time.monotonic()
            counters.outages += 1
            logger.warning("{} is unreachable ({}); waiting up to {:.0f}s for it to come back{}", self.peer, why,
                           self.outage_budget_s, f" (log: {self.log_hint})" if self.log_hint else "")
        delay = HEALTH_POLL_S[0]
        while True:
            if await self.healthy():
                self._outage_over()
                # Healthy but the call itself got 503 (busy, or still warming up): do not spin.
                await asyncio.sleep(backoff_delay(0, self.backoff))
                counters.retried_calls += 1
                return
            if time.monotonic() >= deadline:
                counters.gave_up += 1
                where = f"; see its log: {self.log_hint}" if self.log_hint else ""
                raise PeerUnavailable(url, None, "peer_unavailable",
                                      f"{self.peer} ({self.base_url}) stayed down past the outage budget of "
                                      f"{self.outage_budget_s:.0f}s (last failure: {why}){where}")
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, HEALTH_POLL_S[1])

    def _outage_over(self) -> None:
        if self._down_since is not None:
            waited = time.monotonic() - self._down_since
            self._down_since = None
            self.outage_counters.survived += 1
            self.outage_counters.waited_s += waited
            logger.info("{} is back after {:.1f}s", self.peer, waited)

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
