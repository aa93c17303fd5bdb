"""An fsync'd append-only JSONL journal: idempotency by request id, crash replay and an audit trail.

Each mutation writes an `intent` (the absolute end state of every point it touches, and the response)
before touching Qdrant, and a `commit` after. On start, an intent without a commit is re-applied:
the writes are absolute, so applying them twice is the same as once.

A journal that only grew would make every restart read the whole run (memory and outage growing with the
run's length), so the store compacts it: `rewrite` replaces it atomically with `snapshot` records (the
pool's end state per workspace and the recent request ids) and keeps the segment it replaced as
`<name>.prev`, so the audit trail of the last segment survives and the disk used stays bounded.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
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
        self.records = 0  # records in the file: what `records()` read plus what `append` added since

    def read(self) -> list[dict[str, Any]]:
        return list(self.iter_records())

    def iter_records(self) -> Iterator[dict[str, Any]]:
        """Every complete record, one line in memory at a time; a torn last line (a crash mid-write) is cut off."""
        self.records = 0
        if not self.path.exists():
            return
        torn_at = None
        with open(self.path, "rb") as handle:
            offset = 0
            for line in handle:
                if line.strip():
                    try:
                        record = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        torn_at = offset
                        break
                    self.records += 1
                    yield record
                offset += len(line)
        if torn_at is not None:
            logger.warning("journal {}: dropping a torn record at byte {}", self.path, torn_at)
            with open(self.path, "r+b") as handle:
                handle.truncate(torn_at)

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
        self.records += 1

    def rewrite(self, records: Iterable[dict[str, Any]]) -> None:
        """Replace the journal with `records` atomically; the replaced segment stays as `<name>.prev`."""
        check_disk(self.path)
        self.close()
        data = b"".join(orjson.dumps(r, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n" for r in records)
        previous = self.path.with_name(self.path.name + ".prev")
        if self.path.exists():
            # a hard link, not a rename: until the new journal is in place, the old one is still at its name
            link = previous.with_name(f".{previous.name}.tmp")
            link.unlink(missing_ok=True)
            os.link(self.path, link)
            os.replace(link, previous)
        atomic_write(self.path, data)
        self.records = data.count(b"\n")

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
