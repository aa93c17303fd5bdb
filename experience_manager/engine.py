"""The experience engine: every operation of the service, independent of HTTP.

It composes the three parts, each in its own module: the durable store (`durable`: journal, Qdrant and the
in-memory indexes), the ingest pipeline (`ingest`: summarize, dedup, merge) and retrieval (`retrieval`),
with usage scoring (`scoring`: feedback and archival). What is left here is their lifecycle, the
experience CRUD, import/export and the workspaces.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from loguru import logger

from common.embeddings import Embedder, shared_embedder
from common.schemas import Experience, ExperienceKind
from experience_manager.durable import DurableStore, Plan
from experience_manager.faults import FaultInjector
from experience_manager.index import text_key
from experience_manager.ingest import IngestPipeline, absorb, new_experience
from experience_manager.retrieval import Retriever
from experience_manager.scoring import plan_feedback, plan_prune
from experience_manager.settings import ExperienceManagerSettings
from experience_manager.summarize import Candidate
from experience_manager.text import content_hash


class ExperienceEngine:
    def __init__(self, settings: ExperienceManagerSettings, embedder: Embedder | None = None,
                 faults: FaultInjector | None = None) -> None:
        self.settings = settings
        self.embedder = embedder or shared_embedder()
        self._embed_pool = ThreadPoolExecutor(1, thread_name_prefix="exp-embed")
        self.store = DurableStore(settings, self.embedder, faults or FaultInjector())
        self.ingest = IngestPipeline(settings, self.store, self.embed)
        self.retrieval = Retriever(settings.retrieval, self.store, self.embed)
        self.ready = False

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._embed_pool, self.embedder.encode, ["warm up the embedding model"])
        await self.store.open()
        self.ready = True
        indexes = self.store.indexes
        logger.info("experience store ready: {} workspaces, {} experiences, {} ops replayed",
                    len(indexes), sum(len(i.experiences) for i in indexes.values()), len(self.store.replayed_ops))

    async def close(self) -> None:
        self.ready = False
        await self.store.close()
        self._embed_pool.shutdown(wait=True)
        await self.ingest.close()

    async def embed(self, texts: list[str]) -> np.ndarray:
        return await asyncio.get_running_loop().run_in_executor(self._embed_pool, self.embedder.encode, texts)

    # ------------------------------------------------------------ usage feedback, pruning

    async def feedback(self, workspace_id: str, items: list[dict[str, Any]], *, request_id: str | None,
                       digest: str) -> dict:
        index = self.store.index(workspace_id)
        return await self.store.mutate(workspace_id, "feedback", request_id, digest, lambda: plan_feedback(
            index, items, success_threshold=self.settings.summary.success_threshold, scoring=self.settings.scoring))

    async def prune(self, workspace_id: str, *, dry_run: bool, request_id: str | None, digest: str) -> dict:
        index = self.store.index(workspace_id)
        if dry_run:
            return plan_prune(index, dry_run=True, scoring=self.settings.scoring).result
        return await self.store.mutate(workspace_id, "prune", request_id, digest,
                                       lambda: plan_prune(index, dry_run=False, scoring=self.settings.scoring))

    # ------------------------------------------------------------ CRUD, import/export, workspaces

    async def create(self, workspace_id: str, fields: dict[str, Any], *, request_id: str | None, digest: str) -> dict:
        self.store.writable(workspace_id)
        candidate = Candidate(when_to_use=fields["when_to_use"], content=fields["content"],
                              kind=ExperienceKind(fields.get("kind") or "manual"), quality=fields.get("quality", 0.5),
                              author=fields.get("author") or "manual", tags=fields.get("tags", []),
                              tools=fields.get("tools", []), task_ids=fields.get("task_ids", []))
        vector = (await self.embed([candidate.when_to_use]))[0]

        def build() -> Plan:
            incoming = new_experience(workspace_id, candidate, self.store.embedding_model)
            index = self.store.indexes.get(workspace_id)
            existing_id = index.by_text.get(text_key(incoming)) if index else None
            if existing_id is not None:
                assert index is not None
                updated = absorb(index.experiences[existing_id], incoming, take_text=False)
                return Plan(result={"experience": updated.model_dump(mode="json"), "deduplicated": True},
                            upserts=[(updated, None)])
            return Plan(result={"experience": incoming.model_dump(mode="json"), "deduplicated": False},
                        upserts=[(incoming, vector)])

        return await self.store.mutate(workspace_id, "create", request_id, digest, build)

    async def patch(self, workspace_id: str, experience_id: str, fields: dict[str, Any], *,
                    request_id: str | None, digest: str) -> dict:
        current = self.store.experience(workspace_id, experience_id)
        text_changed = "when_to_use" in fields and fields["when_to_use"] != current.when_to_use
        vector = (await self.embed([fields["when_to_use"]]))[0] if text_changed else None

        def build() -> Plan:
            base = self.store.experience(workspace_id, experience_id)
            data = {**base.model_dump(), **fields, "updated_at": time.time()}
            data["content_hash"] = content_hash(data["when_to_use"], data["content"])
            updated = Experience.model_validate(data)
            return Plan(result={"experience": updated.model_dump(mode="json")}, upserts=[(updated, vector)])

        return await self.store.mutate(workspace_id, "patch", request_id, f"{experience_id}:{digest}", build)

    async def delete(self, workspace_id: str, experience_id: str, *, request_id: str | None) -> dict:
        self.store.experience(workspace_id, experience_id)

        def build() -> Plan:
            self.store.experience(workspace_id, experience_id)
            return Plan(result={"deleted": experience_id}, deletes=[experience_id])

        return await self.store.mutate(workspace_id, "delete", request_id, experience_id, build)

    async def import_experiences(self, workspace_id: str, items: list[dict[str, Any]], *, keep_usage: bool,
                                 request_id: str | None, digest: str) -> dict:
        self.store.writable(workspace_id)
        vectors = await self.embed([item["when_to_use"] for item in items]) if items else []

        def build() -> Plan:
            index = self.store.indexes.get(workspace_id)
            upserts: list[tuple[Experience, np.ndarray | None]] = []
            seen: set[tuple[str, str | None]] = set()
            imported, skipped = [], []
            for item, vector in zip(items, vectors, strict=True):
                digest_ = content_hash(item["when_to_use"], item["content"])
                key = (digest_, item.get("task_kind"))
                data = {k: v for k, v in item.items() if v is not None}
                if not keep_usage:
                    data.pop("usage", None)
                    data.pop("status", None)
                data.update(workspace_id=workspace_id, content_hash=digest_, embedding_model=self.store.embedding_model)
                data.setdefault("experience_id", f"exp_{digest_[:16]}")
                existing = index.by_text.get(key) if index else None
                if key in seen or (existing is not None and existing != data["experience_id"]):
                    skipped.append(data["experience_id"])
                    continue
                seen.add(key)
                experience = Experience.model_validate(data)
                upserts.append((experience, vector))
                imported.append(experience.experience_id)
            return Plan(result={"workspace_id": workspace_id, "imported": imported, "skipped_duplicates": skipped},
                        upserts=upserts)

        return await self.store.mutate(workspace_id, "import", request_id, digest, build)

    async def export(self, workspace_id: str, *, include_archived: bool, write_file: bool) -> dict:
        index = self.store.index(workspace_id)
        experiences = [e.model_dump(mode="json") for e in index.experiences.values()
                       if include_archived or e.status == "active"]
        result: dict[str, Any] = {"workspace_id": workspace_id, "embedding_model": self.store.embedding_model,
                                  "count": len(experiences), "experiences": experiences}
        if write_file:
            path = Path(self.settings.store) / "exports" / f"{workspace_id}.jsonl"
            data = b"".join(orjson.dumps(e) + b"\n" for e in experiences)
            await self.store.write_file(path, data)
            result["path"] = str(path.resolve())
        return result

    def list_workspaces(self) -> list[dict]:
        return [self.workspace_stats(ws, brief=True) for ws in sorted(self.store.indexes)]

    def workspace_stats(self, workspace_id: str, brief: bool = False) -> dict:
        index = self.store.index(workspace_id)
        experiences = list(index.experiences.values())
        active = [e for e in experiences if e.status == "active"]
        stats: dict[str, Any] = {"workspace_id": workspace_id, "active": len(active),
                                 "archived": len(experiences) - len(active), "pool_version": index.version}
        if brief:
            return stats
        kinds: dict[str, int] = {}
        for e in active:
            kinds[e.kind.value] = kinds.get(e.kind.value, 0) + 1
        stats.update(
            kinds=kinds, uses=sum(e.usage.uses for e in experiences),
            mean_utility=round(float(np.mean([e.usage.utility for e in active])), 5) if active else None,
            embedding_model=self.store.embedding_model, cache=self.retrieval.cache_stats())
        return stats

    async def create_workspace(self, workspace_id: str) -> dict:
        self.store.writable(workspace_id)
        if workspace_id in self.store.indexes:
            return {**self.workspace_stats(workspace_id, brief=True), "created": False}
        await self.store.mutate(workspace_id, "create_workspace", None, workspace_id,
                                lambda: Plan(result={"workspace_id": workspace_id}))
        return {**self.workspace_stats(workspace_id, brief=True), "created": True}

    async def drop_workspace(self, workspace_id: str, *, request_id: str | None) -> dict:
        self.store.index(workspace_id)
        result = await self.store.mutate(workspace_id, "drop_workspace", request_id, workspace_id,
                                         lambda: Plan(result={"deleted": workspace_id}, drop_workspace=True))
        self.store.forget_requests(workspace_id)
        return result
