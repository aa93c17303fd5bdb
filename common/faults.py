"""Test-only fault injection for the stores, off unless an environment variable arms it.

Kills: a component's variable (the experience manager's `EXPERIENCE_MANAGER_FAULT`, the trainer's
`EVOLVER_TRAINER_FAULT`, the judge's `EVOLVER_JUDGE_FAULT`) holds `<op>:<point>[:<n>]`; the process
SIGKILLs itself at that point of that write once its count reaches n. The point `torn` sits inside one
record's write: half the record is written and flushed first, which is what a kill between two write(2)
calls of one record leaves on disk.

A full disk: `EVOLVER_DISK_FULL` names a flag file; while that file exists, every store write raises the
error a full disk raises there (ENOSPC, or SQLite's "database or disk is full"), and once it is removed
writes succeed again, as after space was freed. No mount is needed, so CI always runs it.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path
from typing import BinaryIO

from loguru import logger

DISK_FULL_ENV = "EVOLVER_DISK_FULL"
TRAINER_FAULT_ENV = "EVOLVER_TRAINER_FAULT"  # ops: rollouts, rollout_index, metrics (counting records)
JUDGE_FAULT_ENV = "EVOLVER_JUDGE_FAULT"  # op: audit (counting judge requests)


class FaultInjector:
    def __init__(self, env_var: str, spec: str | None = None) -> None:
        spec = spec if spec is not None else os.environ.get(env_var, "")
        parts = spec.split(":") if spec else []
        self.op = parts[0] if parts else None
        self.point = parts[1] if len(parts) > 1 else None
        self.threshold = int(parts[2]) if len(parts) > 2 else 0
        if self.op:
            logger.warning("fault injection armed: {} (test-only; unset {} in production)", spec, env_var)

    def armed(self, op: str, point: str, count: int = 0) -> bool:
        return self.op == op and self.point == point and count >= self.threshold

    def check(self, op: str, point: str, count: int = 0) -> None:
        if self.armed(op, point, count):
            _kill(f"{op}:{point} (count {count})")

    def write_record(self, handle: BinaryIO, data: bytes, op: str, count: int = 0) -> None:
        """`handle.write(data)` (one or more JSON lines), or, armed at `<op>:torn`, everything up to the middle
        of its last line, and a SIGKILL."""
        if self.armed(op, "torn", count):
            last_line = data.rstrip(b"\n").rfind(b"\n") + 1
            cut = last_line + (len(data) - last_line) // 2
            handle.write(data[:cut])
            handle.flush()
            _kill(f"{op}:torn (count {count}), {cut} of {len(data)} bytes written")
        handle.write(data)


def _kill(where: str) -> None:
    logger.warning("fault injection: SIGKILL at {}", where)
    os.kill(os.getpid(), signal.SIGKILL)


class DiskFull(OSError):
    """What a write to a full disk raises; `path` is the store's file, named in every message about it."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def check_disk(path: str | Path) -> None:
    """Before a store write: raise `DiskFull` while the test's flag file exists (never otherwise)."""
    flag = os.environ.get(DISK_FULL_ENV)
    if flag and os.path.exists(flag):
        raise DiskFull(path)


def is_disk_full(exc: BaseException) -> bool:
    """ENOSPC or EDQUOT from a write, or SQLite's SQLITE_FULL."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return type(exc).__name__ == "OperationalError" and "database or disk is full" in str(exc)


def disk_full_message(exc: BaseException) -> str:
    """`the disk is full (writing <path>: <error>)`, for a 507's message and the trainer's last words."""
    where = getattr(exc, "filename", None)
    what = f"writing {where}" if where else "writing its store"
    return f"the disk is full ({what}: {getattr(exc, 'strerror', None) or exc})"
