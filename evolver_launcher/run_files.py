"""Files a run leaves on a node, read and set aside the same way wherever the launcher finds them: a child's
log (its tail for a failure message) and a previous run's folder (moved aside, never overwritten)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a log, reading at most its last 64 KiB."""
    if not path.is_file():
        return "(no log file)"
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 64 * 1024))
        text = f.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def move_aside(folder: Path) -> Path | None:
    """Rename a non-empty `folder` to `<name>.<timestamp>` beside it; returns where it went (None: nothing to move)."""
    if not folder.is_dir() or not any(folder.iterdir()):
        return None
    aside = folder.with_name(f"{folder.name}.{time.strftime('%Y%m%d-%H%M%S')}")
    folder.rename(aside)
    return aside
