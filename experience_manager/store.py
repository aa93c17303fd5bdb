"""Qdrant as the store of record: one collection per workspace, points upserted by stable ids.

Local mode (the default) locks its folder, so this process is the only writer; every call here runs
on the engine's single writer thread. Local mode commits point by point (a batch is not atomic),
which is why the journal, not Qdrant, decides what a crashed batch should have written.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from loguru import logger
from qdrant_client import QdrantClient, models

from common.schemas import Experience

COLLECTION_PREFIX = "exp__"
_POINT_NAMESPACE = uuid.UUID("7c1f6a52-3f0e-4b7e-9a59-0d3c6f7e2b11")


def collection_name(workspace_id: str) -> str:
    return f"{COLLECTION_PREFIX}{workspace_id}"


def point_id(workspace_id: str, experience_id: str) -> str:
    """A stable Qdrant id: the same experience always lands on the same point (never delete-then-insert)."""
    return str(uuid.uuid5(_POINT_NAMESPACE, f"{workspace_id}/{experience_id}"))


def encode_vector(vector: np.ndarray) -> str:
    return base64.b64encode(np.asarray(vector, dtype=np.float32).tobytes()).decode()


def decode_vector(data: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(data), dtype=np.float32).copy()


class QdrantStore:
    def __init__(self, *, path: Path | None, url: str | None, api_key: str | None, dimension: int,
                 batch_size: int) -> None:
        self.dimension, self.batch_size = dimension, batch_size
        if url:
            self.client = QdrantClient(url=url, api_key=api_key)
            self.where = url
        else:
            assert path is not None
            path.mkdir(parents=True, exist_ok=True)
            self.client = QdrantClient(path=str(path))
            self.where = str(path)
        logger.info("qdrant store at {}", self.where)

    def close(self) -> None:
        self.client.close()

    def workspaces(self) -> list[str]:
        names = [c.name for c in self.client.get_collections().collections]
        return sorted(n[len(COLLECTION_PREFIX):] for n in names if n.startswith(COLLECTION_PREFIX))

    def ensure(self, workspace_id: str) -> None:
        name = collection_name(workspace_id)
        if not self.client.collection_exists(name):
            self.client.create_collection(name, vectors_config=models.VectorParams(
                size=self.dimension, distance=models.Distance.COSINE))

    def drop(self, workspace_id: str) -> None:
        name = collection_name(workspace_id)
        if self.client.collection_exists(name):
            self.client.delete_collection(name)

    def apply(self, workspace_id: str, writes: list[dict[str, Any]],
              on_progress: Callable[[int], None] | None = None) -> None:
        """Apply journal writes: `{"upsert": payload, "vector": b64|None}` or `{"delete": id}`."""
        name = collection_name(workspace_id)
        done = 0
        batch: list[models.PointStruct] = []

        def flush() -> None:
            nonlocal done, batch
            if batch:
                self.client.upsert(name, points=batch, wait=True)
                done += len(batch)
                batch = []
                if on_progress:
                    on_progress(done)

        for write in writes:
            if "delete" in write:
                flush()
                self.client.delete(name, points_selector=models.PointIdsList(
                    points=[point_id(workspace_id, write["delete"])]), wait=True)
                done += 1
                if on_progress:
                    on_progress(done)
                continue
            payload = write["upsert"]
            pid = point_id(workspace_id, payload["experience_id"])
            if write.get("vector") is not None:
                batch.append(models.PointStruct(id=pid, vector=decode_vector(write["vector"]).tolist(), payload=payload))
                if len(batch) >= self.batch_size:
                    flush()
            else:
                flush()
                # Same text, new stats: replace the payload in place and keep the stored vector.
                self.client.overwrite_payload(name, payload=payload, points=[pid], wait=True)
                done += 1
                if on_progress:
                    on_progress(done)
        flush()

    def load(self, workspace_id: str) -> Iterator[tuple[Experience, np.ndarray]]:
        name = collection_name(workspace_id)
        offset = None
        while True:
            points, offset = self.client.scroll(name, limit=2048, offset=offset, with_payload=True, with_vectors=True)
            for point in points:
                yield Experience.model_validate(point.payload), np.asarray(point.vector, dtype=np.float32)
            if offset is None:
                break
