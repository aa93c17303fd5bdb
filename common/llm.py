"""OpenAI-compatible chat client, configured per LLM role (explorer, synthesizer, judge, summarizer).

A role is a hosted API, a vLLM server or the bundled `llm_server`: all speak /v1/chat/completions.
Retries with exponential backoff and jitter on 429/5xx/timeouts, a concurrency limit per client,
token usage counted per role, and an optional on-disk cache keyed by the full request.

Structured outputs: a caller passes OpenAI's `response_format` (json_schema or json_object); the role's
`structured` setting decides whether it is sent. `auto` probes the endpoint once with a tiny constrained
request and drops `response_format` where the endpoint refuses it, so callers keep a text-parsing path.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Literal

import httpx
from loguru import logger
from pydantic import BaseModel, Field

from common.config import StrictModel
from common.http import RETRY_EXCEPTIONS, backoff_delay

# Token usage of every role in this process: {role: {"requests", "prompt_tokens", "completion_tokens"}}.
USAGE_BY_ROLE: dict[str, dict[str, int]] = defaultdict(lambda: {"requests": 0, "prompt_tokens": 0,
                                                                 "completion_tokens": 0, "cache_hits": 0})


class LLMRoleConfig(StrictModel):
    base_url: str = Field(description="OpenAI-compatible base URL, e.g. http://127.0.0.1:8001/v1")
    model: str
    api_key_env: str | None = Field(default=None, description="name of the environment variable with the key")
    timeout: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=4, ge=0)
    concurrency: int = Field(default=8, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=1)
    cache_dir: str | None = None
    structured: Literal["auto", "on", "off"] = Field(
        default="auto", description="structured outputs (response_format): auto = use them when the endpoint "
                                    "accepts them, on = always (an endpoint without them fails), off = never")


class LLMError(RuntimeError):
    def __init__(self, role: str, endpoint: str, message: str, status: int | None = None):
        super().__init__(f"LLM role '{role}' at {endpoint}: {message}")
        self.role, self.endpoint, self.status = role, endpoint, status


# The probe's schema: the smallest request that only a server with structured outputs answers with 2xx.
_PROBE_FORMAT = {"type": "json_schema", "json_schema": {
    "name": "probe", "strict": True,
    "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
               "additionalProperties": False}}}


def json_schema_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's `response_format` for a JSON schema (accepted by vLLM and the bundled llm_server too)."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


class ChatResult(BaseModel):
    texts: list[str]
    finish_reasons: list[str | None] = Field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Returned by llm_server and vLLM (with return_token_ids); None from hosted APIs.
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[list[int]] | None = None
    completion_logprobs: list[list[float]] | None = None
    cached: bool = False
    structured: bool = Field(default=False, description="sent with a response_format the endpoint accepted")

    @property
    def text(self) -> str:
        return self.texts[0] if self.texts else ""


class LLMClient:
    def __init__(self, role: str, config: LLMRoleConfig) -> None:
        self.role, self.config = role, config
        self.endpoint = config.base_url.rstrip("/") + "/chat/completions"
        key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
        if config.api_key_env and not key:
            raise LLMError(role, self.endpoint, f"environment variable {config.api_key_env} is not set (put it in .env)")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.AsyncClient(headers=headers, timeout=config.timeout)
        self._limit = asyncio.Semaphore(config.concurrency)
        self._cache = Path(config.cache_dir) if config.cache_dir else None
        if self._cache:
            self._cache.mkdir(parents=True, exist_ok=True)
        self._structured: bool | None = {"on": True, "off": False}.get(config.structured)
        self._probe_lock = asyncio.Lock()

    @property
    def usage(self) -> dict[str, int]:
        return USAGE_BY_ROLE[self.role]

    async def aclose(self) -> None:
        await self._http.aclose()

    def _body(self, messages: list[dict], **params: Any) -> dict:
        body: dict[str, Any] = {"model": self.config.model, "messages": messages}
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        if self.config.max_tokens is not None:
            body["max_tokens"] = self.config.max_tokens
        body.update({k: v for k, v in params.items() if v is not None})
        return body

    async def supports_structured(self) -> bool:
        """Whether `response_format` is sent: fixed by `structured: on|off`, probed once under `auto`."""
        if self._structured is not None:
            return self._structured
        async with self._probe_lock:
            if self._structured is None:
                body = self._body([{"role": "user", "content": 'Reply with {"ok": true}'}], max_tokens=8,
                                  temperature=0.0, response_format=_PROBE_FORMAT)
                try:
                    async with self._limit:
                        await self._post_with_retries(body)
                    self._structured = True
                except LLMError as exc:
                    if exc.status is None or exc.status >= 500 or exc.status in (401, 403, 404, 429):
                        # Down or misconfigured: that says nothing about structured outputs. Ask in text
                        # this time (the call reports its own error) and probe again next time.
                        logger.warning("LLM role {}: structured-output probe failed ({}); asking in text",
                                       self.role, str(exc)[-200:])
                        return False
                    self._structured = False
                    logger.info("LLM role {} at {}: no structured outputs ({}); using text parsing",
                                self.role, self.endpoint, str(exc)[-200:])
        return bool(self._structured)

    async def chat(self, messages: list[dict], response_format: dict[str, Any] | None = None,
                   **params: Any) -> ChatResult:
        """Send one chat completion; params are OpenAI's (temperature, max_tokens, stop, n, seed, ...).

        `response_format` is sent only where structured outputs are available (see `supports_structured`);
        `ChatResult.structured` says whether it was.
        """
        structured = response_format is not None and await self.supports_structured()
        body = self._body(messages, **params, response_format=response_format if structured else None)
        cache_file = self._cache_file(body)
        if cache_file and cache_file.is_file():
            self.usage["cache_hits"] += 1
            return ChatResult.model_validate({**json.loads(cache_file.read_text()), "cached": True})
        try:
            async with self._limit:
                payload = await self._post_with_retries(body)
        except LLMError as exc:
            # Under auto, an endpoint that has structured outputs but refuses this schema (too complex,
            # an unsupported keyword) still answers in text; `on` surfaces the refusal.
            if not structured or self.config.structured != "auto" or exc.status not in (400, 422):
                raise
            logger.warning("LLM role {}: response_format refused ({}); asking without it", self.role,
                           str(exc)[-200:])
            structured = False
            body.pop("response_format", None)
            async with self._limit:
                payload = await self._post_with_retries(body)
        result = self._parse(payload)
        result.structured = structured
        self.usage["requests"] += 1
        self.usage["prompt_tokens"] += result.prompt_tokens
        self.usage["completion_tokens"] += result.completion_tokens
        if cache_file:
            tmp = cache_file.with_suffix(".tmp")
            tmp.write_text(result.model_dump_json())
            tmp.replace(cache_file)
        return result

    def _cache_file(self, body: dict) -> Path | None:
        if not self._cache:
            return None
        key = hashlib.sha256(json.dumps([self.endpoint, body], sort_keys=True).encode()).hexdigest()
        return self._cache / f"{key}.json"

    async def _post_with_retries(self, body: dict) -> dict:
        attempts = 1 + self.config.max_retries
        for attempt in range(attempts):
            last = attempt + 1 >= attempts
            try:
                response = await self._http.post(self.endpoint, json=body)
            except RETRY_EXCEPTIONS as exc:
                if last:
                    raise LLMError(self.role, self.endpoint, f"unreachable after {attempts} tries: "
                                                             f"{type(exc).__name__}: {exc}") from exc
                await asyncio.sleep(backoff_delay(attempt, 0.5))
                continue
            if (response.status_code == 429 or response.status_code >= 500) and not last:
                logger.debug("LLM {} answered {}; retry {}", self.role, response.status_code, attempt + 1)
                await asyncio.sleep(backoff_delay(attempt, 0.5))
                continue
            if not response.is_success:
                raise LLMError(self.role, self.endpoint, f"HTTP {response.status_code}: {response.text[:300]!r}",
                               status=response.status_code)
            try:
                return response.json()
            except ValueError:
                raise LLMError(self.role, self.endpoint, f"non-JSON response: {response.text[:300]!r}") from None
        raise AssertionError("unreachable")

    def _parse(self, payload: Any) -> ChatResult:
        try:
            choices = payload["choices"]
            texts = [c["message"].get("content") or "" for c in choices]
            usage = payload.get("usage") or {}
            token_ids = [c.get("token_ids") for c in choices]
            logprobs = [c.get("token_logprobs") for c in choices]
            return ChatResult(
                texts=texts,
                finish_reasons=[c.get("finish_reason") for c in choices],
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
                prompt_token_ids=payload.get("prompt_token_ids"),
                completion_token_ids=token_ids if all(t is not None for t in token_ids) else None,
                completion_logprobs=logprobs if all(lp is not None for lp in logprobs) else None,
            )
        except (KeyError, TypeError, IndexError, AttributeError) as exc:
            raise LLMError(self.role, self.endpoint,
                           f"malformed completion ({type(exc).__name__}: {exc}): {str(payload)[:300]!r}") from None
