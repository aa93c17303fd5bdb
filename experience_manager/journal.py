"""An fsync'd append-only JSONL journal: idempotency by request id, crash replay and an audit trail.

Each mutation writes an `intent` (the absolute end state of every point it touches, and the response)
before touching Qdrant, and a `commit` after. On start, an intent without a commit is re-applied:
the writes are absolute, so applying them twice is the same as once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
from loguru import logger

from common.faults import check_disk
from common.jsonl import cut_torn_tail


class Journal:
    def __init__(self, path: Path, fsync: bool = True) -> None:
        self.path, self.fsync = path, fsync
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = None

    def read(self) -> list[dict[str, Any]]:
        """All complete records; a torn last line (a crash mid-write) is cut off."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        records, offset = [], 0
        for line in data.split(b"\n"):
            end = offset + len(line) + 1
            if line.strip():
                try:
                    records.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    logger.warning("journal {}: dropping a torn record at byte {}", self.path, offset)
                    with open(self.path, "r+b") as handle:
                        handle.truncate(offset)
                    break
            offset = end
        return records

    def append(self, record: dict[str, Any]) -> None:
        check_disk(self.path)
        if self._file is None:
            cut_torn_tail(self.path)  # what a failed append (a full disk) left: the next record starts clean
            self._file = open(self.path, "ab")
        try:
            self._file.write(orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())
        except OSError:
            self._drop_file()
            raise

    def _drop_file(self) -> None:
        """After a failed write: drop the handle and whatever it still buffers; reopening cuts a torn tail."""
        file, self._file = self._file, None
        try:
            file.close()
        except OSError:
            pass

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temporary file, fsync and rename, so readers see the old or the new file, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
