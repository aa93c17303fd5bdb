"""Append-only JSONL files that a process kill cannot corrupt past its last complete record.

A kill can stop a process between two write(2) calls of one record, leaving a line without its newline.
The next append would glue its record onto that half: the acknowledged record after the kill would be
unreadable. `cut_torn_tail`, called by a writer before its first append to a file, cuts the half record
off. A record counts as written once its newline is in the file: what came before is never touched.
"""

from __future__ import annotations

import os
from pathlib import Path

from loguru import logger


def cut_torn_tail(path: str | Path) -> int:
    """Truncate `path` after its last newline; returns how many bytes were cut (0: none, or no file)."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "r+b") as handle:
        end = size
        while end > 0:  # the last newline, read backwards in blocks: a file may be large
            start = max(0, end - 65536)
            handle.seek(start)
            found = handle.read(end - start).rfind(b"\n")
            if found >= 0:
                end = start + found + 1
                break
            end = start
        if end == size:
            return 0
        handle.truncate(end)
        handle.flush()
        os.fsync(handle.fileno())
    logger.warning("{}: cut a torn last record ({} bytes) left by a kill mid-write", path, size - end)
    return size - end
