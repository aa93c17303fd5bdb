"""Typed async client of llm_server, for the trainer (token in, token out) and anything else.

    async with LLMServerClient("http://127.0.0.1:8001") as llm:
        out = await llm.complete_tokens("smollm2", prompt_token_ids, max_tokens=64, temperature=1.0, n=4)
        out.choices[0].token_ids, out.choices[0].token_logprobs, out.policy_version
        await llm.update_weights("/path/to/exported/hf_dir")     # -> new policy_version

For chat through the OpenAI protocol use `common.llm.LLMClient` or the `openai` package against
`<url>/v1`; this client adds the evolver extensions (token ids, weights, stats).
"""

from __future__ import annotations

from typing import Any

from common.http import ServiceClient
from llm_server.protocol import EpisodeRecord, TokenCompletion, WeightUpdateResponse


class LLMServerClient(ServiceClient):
    def __init__(self, base_url: str, **kwargs: Any) -> None:
        kwargs.setdefault("timeout", 600.0)  # long generations on CPU
        super().__init__(base_url.removesuffix("/v1"), **kwargs)

    async def models(self) -> list[str]:
        body = await self.get("/v1/models")
        return [m["id"] for m in body["data"]]

    async def complete_tokens(self, model: str, prompt_token_ids: list[int], **params: Any) -> TokenCompletion:
        """Continue exactly these tokens; params are OpenAI's (max_tokens, temperature, top_p, stop, n, seed)."""
        body = {"model": model, "prompt_token_ids": list(prompt_token_ids),
                **{k: v for k, v in params.items() if v is not None}}
        return await self.post("/v1/completions", json=body, model=TokenCompletion, idempotent=True)

    async def complete_text(self, model: str, prompt: str, **params: Any) -> TokenCompletion:
        body = {"model": model, "prompt": prompt, **{k: v for k, v in params.items() if v is not None}}
        return await self.post("/v1/completions", json=body, model=TokenCompletion, idempotent=True)

    async def chat(self, model: str, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        """The raw chat.completion body (with prompt_token_ids, per-choice token_ids and token_logprobs)."""
        body = {"model": model, "messages": messages, **{k: v for k, v in params.items() if v is not None}}
        return await self.post("/v1/chat/completions", json=body, idempotent=True)

    async def update_weights(self, path: str, policy_version: int | None = None) -> WeightUpdateResponse:
        """Load weights from an HF dir or state-dict file once in-flight generations finish."""
        body: dict[str, Any] = {"path": str(path)}
        if policy_version is not None:
            body["policy_version"] = policy_version
        return await self.post("/v1/weights", json=body, model=WeightUpdateResponse, idempotent=True)

    async def open_episode(self, experience: str | None = None, metadata: dict[str, Any] | None = None,
                           episode_id: str | None = None, *, force_tools: bool = False,
                           tool_arguments: dict[str, dict[str, list[Any]]] | None = None,
                           script: list[str] | None = None, script_results: list[str] | None = None,
                           sampling: dict[str, Any] | None = None) -> EpisodeRecord:
        """A gateway episode: its agent calls `<url>/v1/episodes/{episode_id}/chat/completions`. `force_tools`
        (exploration) and `script` (replies given, not sampled; `script_results`: what its tool calls returned
        when recorded, to carry generated ids over) make it off-policy. `sampling` `{"temperature", "seed"}`:
        forced on every call of the episode, whatever the agent asks for."""
        body: dict[str, Any] = {"metadata": metadata or {}}
        if force_tools:
            body["force_tools"] = True
        if tool_arguments:
            body["tool_arguments"] = tool_arguments
        if script is not None:
            body["script"] = script
        if script_results is not None:
            body["script_results"] = script_results
        if sampling is not None:
            body["sampling"] = sampling
        if experience:
            body["experience"] = experience
        if episode_id:
            body["episode_id"] = episode_id
        return await self.post("/v1/episodes", json=body, model=EpisodeRecord, idempotent=episode_id is not None)

    async def end_episode(self, episode_id: str) -> EpisodeRecord:
        """End the episode (again is harmless) and read every call it recorded."""
        return await self.post(f"/v1/episodes/{episode_id}/end", model=EpisodeRecord, idempotent=True)

    def episode_url(self, episode_id: str) -> str:
        """The base URL an OpenAI client of this episode uses."""
        return f"{self.base_url}/v1/episodes/{episode_id}"

    async def policy_version(self) -> int:
        return int((await self.get("/v1/weights"))["policy_version"])

    async def stats(self) -> dict[str, Any]:
        return await self.get("/v1/stats")
