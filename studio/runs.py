"""Run folders as the studio sees them: discovery, status, and every file it reads, by safe names only.

A run is a folder under `--runs` made by the launcher (`manifest.json`, `config.yaml`, `logs/`, the
trainer's output) or by the trainer alone (`metrics.jsonl`, `summary.json`). Names from a URL are
checked against a strict pattern and must resolve to a direct child of their folder, so `../` or
a symlink out of the tree is "not found", never a file read.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from common.processes import process_alive

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
ITEM_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
LOG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}\.log")
# A trainer-only run without a summary counts as live while its metrics changed this recently.
LIVE_WINDOW_S = 600.0


class StudioError(Exception):
    """An error page: its status, title and a message that says what to do."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


def not_found(what: str, message: str) -> StudioError:
    return StudioError(404, f"{what} not found", message)


def safe_child(root: Path, name: str, pattern: re.Pattern[str], what: str) -> Path:
    """root/name if name matches the pattern and stays inside root; else a 404."""
    if not pattern.fullmatch(name) or ".." in name:
        raise not_found(what, f"{name[:80]!r} is not a valid {what} name")
    path = (root / name).resolve()
    if path.parent != root.resolve() or not path.exists():
        raise not_found(what, f"there is no {what} named {name[:80]!r}")
    return path


class JsonLines:
    """A JSONL file parsed once per change (size and mtime), so pages re-read it only when it grew."""

    def __init__(self) -> None:
        self._cache: dict[Path, tuple[tuple[int, int], list[dict[str, Any]]]] = {}

    def read(self, path: Path) -> list[dict[str, Any]]:
        try:
            st = path.stat()
        except OSError:
            return []
        key = (st.st_size, st.st_mtime_ns)
        hit = self._cache.get(path)
        if hit and hit[0] == key:
            return hit[1]
        rows = []
        with path.open("rb") as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    break  # a line being written right now
        self._cache[path] = (key, rows)
        return rows


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass
class Run:
    name: str
    path: Path

    @cached_property
    def manifest(self) -> dict[str, Any] | None:
        return read_json(self.path / "manifest.json")

    @cached_property
    def config(self) -> dict[str, Any]:
        """The resolved config: the launcher's config.yaml, else the trainer's config.json."""
        try:
            data = yaml.safe_load((self.path / "config.yaml").read_text())
            if isinstance(data, dict):
                return data
        except (OSError, yaml.YAMLError):
            pass
        trainer = read_json(self.trainer_dir / "config.json")
        return {"trainer": trainer} if trainer else {}

    @property
    def config_text(self) -> str:
        for path in (self.path / "config.yaml", self.trainer_dir / "config.json"):
            if path.is_file():
                return path.read_text(errors="replace")
        return ""

    @cached_property
    def trainer_dir(self) -> Path:
        out = ((self.manifest or {}).get("config") or {}).get("trainer", {}).get("output_dir")
        for candidate in ([Path(out)] if out else []) + [self.path / "trainer"]:
            if (candidate / "metrics.jsonl").is_file() or (candidate / "config.json").is_file():
                return candidate
        return self.path

    @property
    def summary(self) -> dict[str, Any] | None:
        return read_json(self.trainer_dir / "summary.json")

    @property
    def rollouts_dir(self) -> Path:
        return self.trainer_dir / "rollouts"

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    def section(self, name: str) -> dict[str, Any]:
        value = self.config.get(name)
        return value if isinstance(value, dict) else {}

    @property
    def status(self) -> str:
        """live, finished, crashed, or collapsed (the trainer's collapse detectors stopped it)."""
        if (self.summary or {}).get("status") == "collapsed":
            return "collapsed"
        manifest = self.manifest
        if manifest is not None:
            result = manifest.get("result")
            if result is not None:
                return "finished" if result.get("exit_code") == 0 else "crashed"
            lock = self.path.parent / f".{self.name}.lock"
            try:
                pid = int(lock.read_text().strip())
            except (OSError, ValueError):
                return "crashed"
            return "live" if process_alive(pid) else "crashed"
        if (self.trainer_dir / "summary.json").is_file():
            return "finished"
        metrics = self.trainer_dir / "metrics.jsonl"
        if metrics.is_file() and time.time() - metrics.stat().st_mtime < LIVE_WINDOW_S:
            return "live"
        return "crashed"

    @property
    def started(self) -> str:
        created = (self.manifest or {}).get("created_at")
        if created:
            return str(created)
        stamp = self.path.stat().st_mtime
        return datetime.fromtimestamp(stamp, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S%z")

    @property
    def config_name(self) -> str:
        command = (self.manifest or {}).get("command") or []
        if "--conf" in command and command.index("--conf") + 1 < len(command):
            return Path(command[command.index("--conf") + 1]).name
        return "trainer config.json" if (self.trainer_dir / "config.json").is_file() else "-"

    def service_url(self, name: str) -> str | None:
        """The URL of one of this run's services while it is live (never a stale port of a finished run)."""
        launcher = self.section("launcher")
        if name not in (launcher.get("services") or []) or self.status != "live":
            return None
        section = self.section(name)
        host, port = section.get("host", "127.0.0.1"), section.get("port")
        if not port:
            return None
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://{host}:{port}"


def is_run_folder(path: Path) -> bool:
    return path.is_dir() and any((path / f).exists() for f in ("manifest.json", "metrics.jsonl", "trainer"))


class RunsRoot:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    def runs(self) -> list[Run]:
        """Every run folder, newest first; the root itself when it is one run."""
        if not self.root.is_dir():
            return []
        found = [Run(p.name, p) for p in self.root.iterdir() if RUN_NAME.fullmatch(p.name) and is_run_folder(p)]
        if not found and is_run_folder(self.root):
            return [Run(self.root.name, self.root)]
        return sorted(found, key=lambda r: r.path.stat().st_mtime, reverse=True)

    def run(self, name: str) -> Run:
        runs = self.runs()
        if len(runs) == 1 and runs[0].path == self.root and name == self.root.name:
            return runs[0]
        path = safe_child(self.root, name, RUN_NAME, "run")
        if not is_run_folder(path):
            raise not_found("run", f"{name!r} is not a run folder (no manifest.json, metrics.jsonl or trainer/)")
        return Run(name, path)


def log_tail(run: Run, name: str, max_bytes: int = 64_000) -> str:
    path = safe_child(run.logs_dir, name, LOG_NAME, "log")
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - max_bytes))
        return f.read().decode(errors="replace")
