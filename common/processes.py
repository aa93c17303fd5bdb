"""Whether a process, or a process group, still exists.

Signal 0 asks the kernel without sending anything. A process owned by another user answers with a
permission error, which still means it exists; a zombie not yet reaped exists too (its parent must wait
for it).
"""

from __future__ import annotations

import ctypes
import os


def process_alive(pid: int, *, group: bool = False) -> bool:
    """True while process `pid` exists, or, with `group`, while any process of process group `pid` does
    (a launcher's child runs in its own group, which can outlive the process that started it)."""
    if pid <= 0:
        return False  # os.kill would read 0 as "my own group" and a negative id as a group: no such process
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: an id beyond C int, which no process has
        return False
    except PermissionError:
        return True
    return True


def signal_on_parent_death(sig: int) -> None:
    """In a child before exec: the kernel sends `sig` when its parent dies (PR_SET_PDEATHSIG; Linux only, a
    no-op elsewhere)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)
    except OSError:
        pass
