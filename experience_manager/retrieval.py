"""Retrieval: embed the task text, rank a workspace's experiences, answer with the rendered block.

Reads only the in-memory index. Answers are cached per (query, options, pool version): any write to the
workspace bumps its version, so a cached answer is never stale.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable

import numpy as np

from common.service import ServiceError
from experience_manager.durable import DurableStore
from experience_manager.index import Hit
from experience_manager.render import render_experiences
from experience_manager.settings import RetrievalSettings
from experience_manager.text import query_text


class Retriever:
    def __init__(self, settings: RetrievalSettings, store: DurableStore,
                 embed: Callable[[list[str]], Awaitable[np.ndarray]]) -> None:
        self.settings, self.store, self.embed = settings, store, embed
        self._cache: OrderedDict[tuple, dict] = OrderedDict()
        self.cache_hits = self.cache_misses = 0

    def cache_stats(self) -> dict[str, int]:
        return {"hits": self.cache_hits, "misses": self.cache_misses, "size": len(self._cache)}

    async def retrieve(self, workspace_id: str, query: str, *, top_k: int | None = None,
                       min_similarity: float | None = None, exclude_ids: list[str] | None = None,
                       task_kind: str | None = None) -> dict:
        return (await self.retrieve_batch(workspace_id, [query], top_k=top_k, min_similarity=min_similarity,
                                          exclude_ids=exclude_ids, task_kind=task_kind))[0]

    async def retrieve_batch(self, workspace_id: str, queries: list[str], *, top_k: int | None = None,
                             min_similarity: float | None = None, exclude_ids: list[str] | None = None,
                             task_kind: str | None = None) -> list[dict]:
        """`task_kind`: the queries' task kind, when known; hits of that kind rank first."""
        index = self.store.index(workspace_id)
        cfg = self.settings
        top_k = top_k or cfg.top_k
        min_similarity = cfg.min_similarity if min_similarity is None else min_similarity
        exclude = frozenset(exclude_ids or ())
        texts = [query_text(q) for q in queries]
        for text, raw in zip(texts, queries, strict=True):
            if not text:
                raise ServiceError(422, "empty_query", f"the query has no task text to embed: {raw[:100]!r}")
        results: list[dict | None] = []
        missing: list[int] = []
        for i, text in enumerate(texts):
            key = (workspace_id, text, top_k, min_similarity, exclude, task_kind, index.version)
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.cache_hits += 1
                results.append({**cached, "cached": True})
            else:
                results.append(None)
                missing.append(i)
        if missing:
            self.cache_misses += len(missing)
            vectors = await self.embed([texts[i] for i in missing])
            version = index.version
            for i, vector in zip(missing, vectors, strict=True):
                hits = index.search(vector, texts[i], top_k=top_k, min_relevance=min_similarity,
                                    lexical_weight=cfg.lexical_weight, utility_weight=cfg.utility_weight,
                                    candidate_factor=cfg.candidate_factor, exclude=exclude, task_kind=task_kind)
                response = retrieval_response(workspace_id, texts[i], hits, version)
                results[i] = {**response, "cached": False}
                if cfg.cache_size and index.version == version:
                    self._cache[(workspace_id, texts[i], top_k, min_similarity, exclude, task_kind, version)] = response
                    while len(self._cache) > cfg.cache_size:
                        self._cache.popitem(last=False)
        return results  # type: ignore[return-value]


def retrieval_response(workspace_id: str, text: str, hits: list[Hit], version: int) -> dict:
    experiences = [{
        "experience_id": h.experience.experience_id, "when_to_use": h.experience.when_to_use,
        "content": h.experience.content, "kind": h.experience.kind.value, "tags": h.experience.tags,
        "tools": h.experience.tools, "similarity": round(h.similarity, 5), "relevance": round(h.relevance, 5),
        "score": round(h.score, 5), "utility": round(h.experience.usage.utility, 5),
        "quality": h.experience.quality, "author": h.experience.provenance.author,
        "task_kind": h.experience.task_kind,
        "created_at": h.experience.created_at, "updated_at": h.experience.updated_at,
        **({"demonstration": [m.model_dump(mode="json", exclude_none=True) for m in h.experience.demonstration]}
           if h.experience.demonstration else {}),
    } for h in hits]
    return {"workspace_id": workspace_id, "query": text, "experiences": experiences,
            "experience_ids": [e["experience_id"] for e in experiences],
            "rendered": render_experiences([(h.experience.when_to_use, h.experience.content) for h in hits]),
            "pool_version": version}
