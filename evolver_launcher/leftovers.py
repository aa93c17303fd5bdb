"""What a launcher leaves if it dies without stopping its children (`kill -9`), and how the next one cleans it.

Every child of a run, and everything those children start (Ray's gcs_server, raylet and workers,
which Ray may move into other process groups), inherits `EVOLVER_LAUNCH_ID=<id>` in its environment.
While it runs, a launcher keeps a small registry next to its run folder's lock: the id and the files
to remove once it is gone (the Ray head's address file). A launcher that starts finds the registries
whose lock nobody holds any more, stops the processes carrying their id and removes those files.
Processes are matched by that marker alone, never by name, so nothing another user or run started is
touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

MARKER = "EVOLVER_LAUNCH_ID"


def new_launch_id() -> str:
    return uuid.uuid4().hex


def registry_path(run_dir: Path) -> Path:
    return run_dir.parent / f".{run_dir.name}.launch.json"


def lock_path_of(registry: Path) -> Path:
    return registry.with_name(registry.name.removesuffix(".launch.json") + ".lock")


def write_registry(run_dir: Path, launch_id: str, cleanup_files: Iterable[Path] = ()) -> Path:
    path = registry_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"launch_id": launch_id, "pid": os.getpid(),
                               "cleanup_files": [str(p) for p in cleanup_files]}))
    os.replace(tmp, path)
    return path


def marked_processes(launch_id: str) -> list[int]:
    """Pids (other than ours) whose environment carries this launch id."""
    needle = f"{MARKER}={launch_id}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # gone, or another user's
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def terminate(pids: Iterable[int], grace_s: float, reap: Callable[[], None] = lambda: None) -> list[int]:
    """SIGTERM, wait up to `grace_s`, SIGKILL what is left; returns the pids that needed SIGKILL."""
    pids = [p for p in pids if alive(p)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        reap()
        time.sleep(0.05)
    stubborn = [p for p in pids if alive(p)]
    for pid in stubborn:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(p) for p in stubborn):
        reap()
        time.sleep(0.05)
    return stubborn


# Ray's own order (`ray stop`): raylet first, so nothing reconnects; gcs_server last, once its
# clients are gone (it ignores SIGTERM while they are connected).
RAY_FIRST, RAY_LAST = ("raylet",), ("gcs_server",)


def stop_ray_processes(pids: list[int], grace_s: float, reap: Callable[[], None] = lambda: None) -> list[int]:
    """Stop a Ray head's processes in three buckets, the grace split between them, as `ray stop` does."""
    first = [p for p in pids if process_name(p) in RAY_FIRST]
    last = [p for p in pids if process_name(p) in RAY_LAST]
    middle = [p for p in pids if p not in first and p not in last]
    stubborn: list[int] = []
    for bucket in (first, middle, last):
        stubborn += terminate(bucket, grace_s / 3, reap)
    return stubborn


def reap_abandoned(runs_dir: Path, own_registry: Path | None, say: Callable[[str], None]) -> int:
    """Stop what launchers that died left running under `runs_dir`; returns the number of processes stopped.

    A registry is abandoned when nobody holds its lock: a live launcher holds its lock all its life.
    `own_registry` is this launcher's (its lock is ours now, so the previous holder is dead).
    """
    stopped = 0
    for registry in sorted(runs_dir.glob(".*.launch.json")):
        with _lock_if_free(registry, own=registry == own_registry) as free:
            if not free:
                continue
            try:
                data = json.loads(registry.read_text())
                launch_id = str(data["launch_id"])
            except (OSError, ValueError, KeyError):
                registry.unlink(missing_ok=True)
                continue
            pids = marked_processes(launch_id)
            if pids:
                say(f"a previous launcher (pid {data.get('pid')}) died without stopping its children: "
                    f"stopping {len(pids)} leftover process(es) of that run")
                stop_ray_processes(pids, grace_s=6.0)
                stopped += len(pids)
            for name in data.get("cleanup_files", []):
                Path(name).unlink(missing_ok=True)
            registry.unlink(missing_ok=True)
    return stopped


@contextlib.contextmanager
def _lock_if_free(registry: Path, own: bool):
    if own:
        yield True
        return
    lock = lock_path_of(registry)
    if not lock.exists():
        yield True
        return
    with lock.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False  # its launcher is alive
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
