"""The policy the rollouts sample from: in-process (HF model + the continuous-batching engine) or an
OpenAI-compatible completions endpoint that returns token ids (llm_server, vLLM).

Both take prompt token ids and give back the generated token ids, their log-probs and the policy
version that produced them, so a rollout never re-tokenizes generated text. `generate` is the one
callable the agent loop needs (a veRL AgentLoop wraps its own server manager in the same shape).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from loguru import logger

from common.http import ServiceCallError, ServiceClient
from engine.generation import Engine, SamplingParams
from llm_server.protocol import DEFAULT_WEIGHTS_DIR, WEIGHTS_UPLOAD
from trainer.config import uploads_weights


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]  # log-prob of each generated token under the generating policy (raw logits)
    text: str  # decoded by the generator (special tokens skipped); never re-encoded
    finish_reason: str  # "stop" or "length"
    policy_version: int


GenerateFn = Callable[[list[int], Sampling], Awaitable[Generation]]


class Policy(Protocol):
    policy_version: int

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Generation: ...

    async def load_weights(self, model: torch.nn.Module) -> int: ...

    async def aclose(self) -> None: ...


class InProcessPolicy:
    """A private copy of the model behind the batching engine: concurrent rollouts share forward passes.

    The trainer's model is never generated from directly: `load_weights` copies its tensors into the
    engine between generations (the engine drains running rows first), so every sample has exactly
    one policy version.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, max_batch: int = 32, threads: int | None = None,
                 policy_version: int = 0, dtype: torch.dtype | None = None, prefix_cache_mb: int = 0) -> None:
        import copy

        serving = copy.deepcopy(model).eval()
        train_dtype = next(model.parameters()).dtype
        if dtype is not None and dtype != train_dtype:
            serving = serving.to(dtype)
        for p in serving.parameters():
            p.requires_grad_(False)
        # The rollout's log-probs can stand for the update's old log-probs only under the training numerics:
        # bf16 weights shift them by ~1e-2 (the update's fp32 recompute matches to 1e-3).
        self.exact_logprobs = next(serving.parameters()).dtype == train_dtype
        self.engine = Engine(serving, tokenizer, max_batch=max_batch, threads=threads, policy_version=policy_version,
                             prefix_cache_bytes=prefix_cache_mb << 20)

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Generation:
        params = SamplingParams(max_tokens=sampling.max_tokens, temperature=sampling.temperature,
                                top_p=sampling.top_p, seed=sampling.seed)
        result = await asyncio.wrap_future(self.engine.submit(prompt_ids, params))
        choice = result.completions[0]
        return Generation(list(choice.token_ids), list(choice.token_logprobs), choice.text, choice.finish_reason,
                          result.policy_version)

    async def load_weights(self, model: torch.nn.Module) -> int:
        tensors = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
        return int(await asyncio.wrap_future(self.engine.update_weights(tensors)))

    @property
    def stats(self) -> Any:
        return self.engine.stats

    async def aclose(self) -> None:
        await asyncio.to_thread(self.engine.close)


def engine_usage(stats: Any) -> dict[str, Any]:
    """Where an engine's work went (`EngineStats`): prompt tokens computed, copied or resumed, the time
    spent on prompts against decoding, and the share of the decode attention's reads that were padding."""
    return {"prompt_tokens": stats.prompt_tokens, "prefill_tokens": stats.prefill_tokens,
            "shared_prefix_tokens": stats.shared_prefix_tokens, "resumed_rows": stats.resumed_rows,
            "reused_prefix_tokens": stats.reused_prefix_tokens, "generated_tokens": stats.generated_tokens,
            "decode_steps": stats.decode_steps, "max_rows_in_batch": stats.max_rows_in_batch,
            "kv_reallocations": stats.kv_reallocations,
            "prefill_s": round(stats.prefill_seconds, 3), "decode_s": round(stats.decode_seconds, 3),
            "decode_padding_share": round(1 - stats.real_columns / stats.attended_columns, 4)
            if stats.attended_columns else 0.0}


def engine_seconds(policy: Any) -> tuple[float, float] | None:
    """(prefill, decode) seconds an in-process policy's engine has spent so far; None for an endpoint."""
    if not isinstance(policy, InProcessPolicy):
        return None
    return policy.stats.prefill_seconds, policy.stats.decode_seconds


class EndpointError(RuntimeError):
    pass


class EndpointPolicy:
    """An OpenAI-compatible `/v1/completions` server that takes and returns token ids.

    The prompt goes as a list of token ids in `prompt` (OpenAI's token-array prompt), which both read.
    llm_server answers per choice `token_ids`, `token_logprobs` and a top-level `policy_version`; vLLM,
    with `return_tokens_as_token_ids`, names each token `token_id:<id>` in `logprobs.tokens`; both
    shapes are read.
    """

    def __init__(self, base_url: str, model: str, *, timeout: float = 300.0, api_key_env: str | None = None,
                 weights_dir: str | os.PathLike | None = None, outage: dict[str, Any] | None = None,
                 transfer: str = "auto") -> None:
        token = os.environ.get(api_key_env) if api_key_env else None
        self.base_url, self.model = base_url.rstrip("/"), model
        self.upload = uploads_weights(transfer, base_url)
        # `outage`: the trainer's outage policy for this peer (ServiceClient's peer/outage_budget_s/log_hint).
        self.client = ServiceClient(self.base_url, token=token, timeout=timeout, retries=2, **(outage or {}))
        self.policy_version = 0
        if weights_dir is None:  # inside the server's default weights_dir, the only place it loads from
            DEFAULT_WEIGHTS_DIR.mkdir(parents=True, exist_ok=True)
            weights_dir = tempfile.mkdtemp(prefix="policy-", dir=DEFAULT_WEIGHTS_DIR)
        self.weights_dir = Path(weights_dir)
        self._pushed: Path | None = None  # the last weights file the server loaded
        self.restored = 0  # times the server came back without our weights and got them again
        self._restoring = asyncio.Lock()

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Generation:
        body: dict[str, Any] = {
            "model": self.model, "prompt": prompt_ids,
            "max_tokens": sampling.max_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "logprobs": 1, "return_tokens_as_token_ids": True, "skip_special_tokens": True,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        # Generation with a fixed seed is repeatable and changes nothing on the server: safe to send again.
        data = await self._complete(body)
        choice = data["choices"][0]
        version = int(data.get("policy_version", choice.get("policy_version", self.policy_version)))
        if version < self.policy_version and self._pushed is not None:
            # The server restarted from its base weights: give it ours again and generate on them.
            await self._restore(version)
            data = await self._complete(body)
            choice = data["choices"][0]
            version = int(data.get("policy_version", choice.get("policy_version", self.policy_version)))
        ids, logprobs = _read_tokens(choice)
        self.policy_version = max(self.policy_version, version)
        return Generation(ids, logprobs, choice.get("text", ""), choice.get("finish_reason") or "stop", version)

    async def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self.client.post("/v1/completions", json=body, idempotent=True)
        except ServiceCallError as exc:
            raise EndpointError(str(exc)) from exc

    async def _restore(self, served_version: int) -> None:
        async with self._restoring:  # concurrent rollouts notice together; one reload is enough
            current = int((await self.client.get("/v1/weights"))["policy_version"])
            if current >= self.policy_version:
                return
            logger.warning("{} serves policy version {} (restarted?), the trainer is at {}: reloading {}",
                           self.base_url, served_version, self.policy_version, self._pushed)
            await self._send_weights(self._pushed, self.policy_version)
            self.restored += 1

    async def _send_weights(self, path: Path, version: int) -> dict[str, Any]:
        """Have the server load the weights file at `path` as `version`: by its path, or uploaded."""
        if self.upload:
            data = await asyncio.to_thread(path.read_bytes)
            return await self.client.request("POST", WEIGHTS_UPLOAD, content=data, params={"policy_version": version},
                                             idempotent=True, timeout=600)
        return await self.client.post("/v1/weights", json={"path": str(path), "policy_version": version},
                                      idempotent=True, timeout=600)

    async def load_weights(self, model: torch.nn.Module) -> int:
        """Write the weights to a file and ask the server to load them (`POST /v1/weights`)."""
        from safetensors.torch import save_file

        self.weights_dir.mkdir(parents=True, exist_ok=True)
        path = self.weights_dir / "policy.safetensors"
        tmp = path.with_suffix(".tmp")
        state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        # Tied weights share storage; safetensors refuses aliases, and the server re-ties them.
        seen: dict[int, str] = {}
        for name in list(state):
            ptr = state[name].data_ptr()
            if ptr in seen:
                del state[name]
            else:
                seen[ptr] = name
        await asyncio.to_thread(save_file, state, str(tmp))
        os.replace(tmp, path)
        # The version is the trainer's, so loading the same file twice (a retry) lands on the same version.
        target = self.policy_version + 1
        try:
            data = await self._send_weights(path, target)
        except ServiceCallError as exc:
            raise EndpointError(str(exc)) from exc
        self._pushed = path
        self.policy_version = int(data.get("policy_version", target))
        return self.policy_version

    async def aclose(self) -> None:
        await self.client.aclose()


def _read_tokens(choice: dict[str, Any]) -> tuple[list[int], list[float]]:
    if "token_ids" in choice and choice["token_ids"] is not None:
        ids = [int(t) for t in choice["token_ids"]]
        logprobs = choice.get("token_logprobs")
        if logprobs is None and isinstance(choice.get("logprobs"), dict):
            logprobs = choice["logprobs"].get("token_logprobs")
        return ids, [float(x) for x in (logprobs or [0.0] * len(ids))]
    lp = choice.get("logprobs") or {}
    tokens = lp.get("tokens")
    if tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        return [int(t.split(":", 1)[1]) for t in tokens], [float(x) for x in lp.get("token_logprobs", [])]
    raise EndpointError("the endpoint returned no token ids: it must support token-in/token-out "
                        "(llm_server, or vLLM with return_tokens_as_token_ids); a chat-only API can only evaluate")
