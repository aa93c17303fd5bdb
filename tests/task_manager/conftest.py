"""Real services for the task-manager tests: the env service (flights) and task managers over HTTP."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import ServiceProcess, run_service


@pytest.fixture(scope="session")
def flights_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    conf = tmp_path_factory.mktemp("env") / "env.yaml"
    conf.write_text(yaml.safe_dump({"env_service": {"environments": {"flights": {}}}}))
    with run_service("env_service", ["--conf", str(conf)]) as service:
        yield service


def write_conf(path: Path, env_url: str, store_dir: Path, **section: Any) -> Path:
    path.write_text(yaml.safe_dump({"task_manager": {"env_url": env_url, "store_dir": str(store_dir),
                                                     "environments": ["flights"], **section}}))
    return path


def stored_rows(store_dir: Path, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
    """Read the task store directly: references are never served over HTTP, so tests look here."""
    db = sqlite3.connect(str(store_dir / "tasks.sqlite"))
    db.row_factory = sqlite3.Row
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()
