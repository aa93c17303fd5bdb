"""OpenAI-compatible chat client, configured per LLM role (explorer, synthesizer, judge, summarizer).

A role is a hosted API, a vLLM server or the bundled `llm_server`: all speak /v1/chat/completions.
Retries with exponential backoff and jitter on 429/5xx/timeouts, a concurrency limit per client,
token usage counted per role, and an optional on-disk cache keyed by the full request.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

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


class LLMError(RuntimeError):
    def __init__(self, role: str, endpoint: str, message: str):
        super().__init__(f"LLM role '{role}' at {endpoint}: {message}")
        self.role, self.endpoint = role, endpoint


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

    async def chat(self, messages: list[dict], **params: Any) -> ChatResult:
        """Send one chat completion; params are OpenAI's (temperature, max_tokens, stop, n, seed, ...)."""
        body = self._body(messages, **params)
        cache_file = self._cache_file(body)
        if cache_file and cache_file.is_file():
            self.usage["cache_hits"] += 1
            return ChatResult.model_validate({**json.loads(cache_file.read_text()), "cached": True})
        async with self._limit:
            payload = await self._post_with_retries(body)
        result = self._parse(payload)
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
                raise LLMError(self.role, self.endpoint, f"HTTP {response.status_code}: {response.text[:300]!r}")
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
