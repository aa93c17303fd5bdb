"""The durable store: the journal and Qdrant on disk, the in-memory workspace indexes that mirror them.

Concurrency model: one asyncio lock orders all mutations; each mutation plans its absolute end state
in the event loop, makes it durable on the single writer thread (journal intent -> Qdrant -> commit),
then mirrors it into the in-memory index. Retrieval reads only the in-memory index.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from loguru import logger

from common.embeddings import Embedder
from common.schemas import Experience
from common.service import ServiceError
from experience_manager.faults import FaultInjector
from experience_manager.index import WorkspaceIndex
from experience_manager.journal import Journal, atomic_write
from experience_manager.settings import ExperienceManagerSettings
from experience_manager.store import QdrantStore, encode_vector
from experience_manager.text import valid_id

RequestKey = tuple[str, str, str]  # (workspace, op, request_id)
SNAPSHOT_SLICE = 256  # request ids per snapshot record


def body_digest(body: Any) -> str:
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass
class Plan:
    """What a mutation will write (absolute end states) and what it answers."""

    result: dict[str, Any]
    upserts: list[tuple[Experience, np.ndarray | None]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    drop_workspace: bool = False


class DurableStore:
    def __init__(self, settings: ExperienceManagerSettings, embedder: Embedder, faults: FaultInjector) -> None:
        self.settings, self.embedder, self.faults = settings, embedder, faults
        self.embedding_model = f"{embedder.name}@{embedder.dimension}"
        self.indexes: dict[str, WorkspaceIndex] = {}
        self.done: dict[RequestKey, tuple[str, dict]] = {}
        self.replayed_ops: list[str] = []
        self._lock = asyncio.Lock()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="exp-writer")
        self.qdrant: QdrantStore | None = None
        self.journal: Journal | None = None

    # ------------------------------------------------------------ lifecycle

    async def open(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._writer, self._open)

    async def close(self) -> None:
        if self.qdrant is not None:
            await asyncio.get_running_loop().run_in_executor(self._writer, self._close_files)
        self._writer.shutdown(wait=True)

    def _close_files(self) -> None:
        if self.journal:
            self.journal.close()
        if self.qdrant:
            self.qdrant.close()

    def _open(self) -> None:
        root = Path(self.settings.store)
        root.mkdir(parents=True, exist_ok=True)
        meta_path = root / "meta.json"
        meta = orjson.loads(meta_path.read_bytes()) if meta_path.exists() else None
        self.qdrant = QdrantStore(
            path=None if self.settings.qdrant_url else root / "qdrant", url=self.settings.qdrant_url,
            api_key=self._qdrant_key(), dimension=self.embedder.dimension, batch_size=self.settings.upsert_batch_size)
        self.journal = Journal(root / "journal.jsonl", fsync=self.settings.journal_fsync)
        self._replay()
        reembed = meta is not None and (meta.get("embedding_model") != self.embedder.name
                                        or meta.get("dimension") != self.embedder.dimension)
        for workspace_id in self.qdrant.workspaces():
            self.indexes[workspace_id] = self._load_workspace(workspace_id, reembed)
        atomic_write(meta_path, orjson.dumps({"embedding_model": self.embedder.name,
                                              "dimension": self.embedder.dimension, "format": 1}))

    def _qdrant_key(self) -> str | None:
        name = self.settings.qdrant_api_key_env
        return os.environ.get(name) if name else None

    def _replay(self) -> None:
        """Re-apply intents a kill left without their commit; rebuild the window of answered request ids."""
        assert self.journal is not None
        pending: dict[str, dict] = {}
        for record in self.journal.iter_records():
            kind = record.get("t")
            if kind == "snapshot":
                for ws, op, request_id, digest, result in record.get("requests", ()):
                    self.remember((ws, op, request_id), digest, result)
            elif kind == "intent":
                pending[record["op_id"]] = record
                if record.get("drop"):
                    self.forget_requests(record["ws"])
                if record.get("request_id"):
                    self.remember((record["ws"], record["op"], record["request_id"]), record["body_hash"],
                                  record["result"])
            elif kind == "commit":
                pending.pop(record["op_id"], None)
        for op_id, record in pending.items():
            logger.warning("replaying {} {} on workspace {} (interrupted before its commit)",
                           record["op"], op_id, record["ws"])
            self._apply_to_qdrant(record)
            self.journal.append({"t": "commit", "op_id": op_id, "replayed": True, "ts": time.time()})
            self.replayed_ops.append(op_id)

    def remember(self, key: RequestKey, digest: str, result: dict) -> None:
        """Keep the answer to a request id; only the newest `idempotency_window` ids are kept."""
        self.done.pop(key, None)
        self.done[key] = (digest, result)
        while len(self.done) > self.settings.idempotency_window:
            del self.done[next(iter(self.done))]

    def _compact(self) -> None:
        """Rewrite the journal as the pool's end state and the remembered request ids (no intent is open:
        the caller holds the mutation lock, and every mutation commits before releasing it)."""
        assert self.journal is not None
        now = time.time()
        requests = [[*key, digest, result] for key, (digest, result) in self.done.items()]
        # in slices, so that a restart never holds more than one slice's text at once
        snapshot = [{"t": "snapshot", "ts": now, "requests": requests[i:i + SNAPSHOT_SLICE]}
                    for i in range(0, len(requests), SNAPSHOT_SLICE)]
        snapshot += [{"t": "snapshot", "ts": now, "ws": workspace_id,
                      "writes": [{"upsert": e.model_dump(mode="json"), "vector": None}
                                 for e in index.experiences.values()]}
                     for workspace_id, index in self.indexes.items()]
        self.faults.check("compact", "before_rewrite")
        self.journal.rewrite(snapshot)
        self.faults.check("compact", "after_rewrite")
        logger.info("compacted the journal to {} snapshot records ({} request ids, {} workspaces)",
                    len(snapshot), len(self.done), len(self.indexes))

    def _load_workspace(self, workspace_id: str, reembed: bool) -> WorkspaceIndex:
        assert self.qdrant is not None
        index = WorkspaceIndex(workspace_id, self.embedder.dimension)
        loaded = list(self.qdrant.load(workspace_id))
        if reembed and loaded:
            # The embedding model changed since these vectors were written: recompute and rewrite them.
            logger.warning("re-embedding {} experiences of {} for {}", len(loaded), workspace_id, self.embedding_model)
            vectors = self.embedder.encode([e.when_to_use for e, _ in loaded])
            self.qdrant.drop(workspace_id)
            self.qdrant.ensure(workspace_id)
            experiences = [e.model_copy(update={"embedding_model": self.embedding_model}) for e, _ in loaded]
            self.qdrant.apply(workspace_id, [{"upsert": e.model_dump(mode="json"), "vector": encode_vector(v)}
                                             for e, v in zip(experiences, vectors, strict=True)])
            loaded = list(zip(experiences, vectors, strict=True))
        for experience, vector in loaded:
            index.put(experience, vector)
        return index

    # ------------------------------------------------------------ the mutation core

    def _apply_to_qdrant(self, record: dict) -> None:
        assert self.qdrant is not None
        op, workspace_id = record["op"], record["ws"]
        if record.get("drop"):
            self.qdrant.drop(workspace_id)
            return
        self.qdrant.ensure(workspace_id)
        self.qdrant.apply(workspace_id, record["writes"],
                          on_progress=lambda n: self.faults.check(op, "after_upsert", n))

    def _durable(self, record: dict) -> None:
        assert self.journal is not None
        op = record["op"]
        self.journal.append(record)
        self.faults.check(op, "after_intent")
        self._apply_to_qdrant(record)
        self.faults.check(op, "before_commit")
        self.journal.append({"t": "commit", "op_id": record["op_id"], "ts": time.time()})
        self.faults.check(op, "after_commit")

    def prior(self, key: RequestKey | None, digest: str) -> dict | None:
        """The first answer to a request id seen before; 409 when the id came with a different body."""
        if key is None or key not in self.done:
            return None
        stored_digest, result = self.done[key]
        if stored_digest != digest:
            raise ServiceError(409, "request_id_conflict",
                               f"request_id {key[2]!r} was already used for a different {key[1]} request on "
                               f"workspace {key[0]!r}; use a new request_id")
        return {**result, "idempotent_replay": True}

    async def mutate(self, workspace_id: str, op: str, request_id: str | None, digest: str,
                     build: Callable[[], Awaitable[Plan] | Plan]) -> dict:
        """Plan under the lock with `build`, make the plan durable, mirror it, answer its result."""
        key = (workspace_id, op, request_id) if request_id else None
        prior = self.prior(key, digest)
        if prior is not None:
            return prior
        async with self._lock:
            prior = self.prior(key, digest)
            if prior is not None:
                return prior
            plan = build()
            if asyncio.iscoroutine(plan):
                plan = await plan
            assert isinstance(plan, Plan)
            writes = [{"upsert": e.model_dump(mode="json"), "vector": encode_vector(v) if v is not None else None}
                      for e, v in plan.upserts] + [{"delete": d} for d in plan.deletes]
            record = {"t": "intent", "op_id": uuid.uuid4().hex, "op": op, "ws": workspace_id,
                      "request_id": request_id, "body_hash": digest, "ts": time.time(), "writes": writes,
                      "drop": plan.drop_workspace, "result": plan.result}
            await asyncio.get_running_loop().run_in_executor(self._writer, self._durable, record)
            self._mirror(workspace_id, plan)
            if key is not None:
                self.remember(key, digest, plan.result)
            if 0 < self.settings.journal_compact_records <= self.journal.records:
                try:
                    await asyncio.get_running_loop().run_in_executor(self._writer, self._compact)
                except OSError as exc:  # the mutation itself is durable: answer it, compact after a later one
                    logger.warning("journal compaction failed, kept the journal as it was: {}", exc)
        return plan.result

    def _mirror(self, workspace_id: str, plan: Plan) -> None:
        if plan.drop_workspace:
            self.indexes.pop(workspace_id, None)
            return
        index = self.indexes.get(workspace_id)
        if index is None:
            index = self.indexes[workspace_id] = WorkspaceIndex(workspace_id, self.embedder.dimension)
        for experience, vector in plan.upserts:
            index.put(experience, vector)
        for experience_id in plan.deletes:
            index.delete(experience_id)

    def forget_requests(self, workspace_id: str) -> None:
        """Requests replayed by id against a dropped workspace must not resurrect stale answers."""
        self.done = {k: v for k, v in self.done.items() if k[0] != workspace_id or k[1] == "drop_workspace"}

    async def write_file(self, path: Path, data: bytes) -> None:
        """Write atomically on the writer thread, in order with the mutations."""
        await asyncio.get_running_loop().run_in_executor(self._writer, atomic_write, path, data)

    # ------------------------------------------------------------ lookups with clear errors

    def check_workspace_id(self, workspace_id: str) -> None:
        if not valid_id(workspace_id):
            raise ServiceError(422, "invalid_workspace_id",
                               f"workspace id {workspace_id[:80]!r} must match ^[A-Za-z0-9_-]{{1,64}}$")

    def index(self, workspace_id: str) -> WorkspaceIndex:
        self.check_workspace_id(workspace_id)
        index = self.indexes.get(workspace_id)
        if index is None:
            raise ServiceError(404, "workspace_not_found", f"workspace {workspace_id!r} does not exist",
                               {"workspaces": sorted(self.indexes)[:50]})
        return index

    def writable(self, workspace_id: str) -> None:
        """Refuse a bad id, or a new workspace past max_workspaces."""
        self.check_workspace_id(workspace_id)
        if workspace_id not in self.indexes and len(self.indexes) >= self.settings.max_workspaces:
            raise ServiceError(409, "too_many_workspaces",
                               f"the service already holds {len(self.indexes)} workspaces (max_workspaces); "
                               f"delete one first")

    def experience(self, workspace_id: str, experience_id: str) -> Experience:
        index = self.index(workspace_id)
        if not valid_id(experience_id):
            raise ServiceError(422, "invalid_experience_id",
                               f"experience id {experience_id[:80]!r} must match ^[A-Za-z0-9_-]{{1,64}}$")
        experience = index.experiences.get(experience_id)
        if experience is None:
            raise ServiceError(404, "experience_not_found",
                               f"experience {experience_id!r} does not exist in workspace {workspace_id!r}")
        return experience
