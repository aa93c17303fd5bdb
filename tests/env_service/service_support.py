"""Shared by the env-service core tests: a run YAML and a real server subprocess."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import ServiceProcess, run_service

FAST_ENVIRONMENTS: dict[str, Any] = {
    "flights": {"splits": {"train": 40, "validation": 8, "test": 8}},
    "gym": {"envs": ["FrozenLake-v1", "Taxi-v4", "CliffWalking-v1"], "splits": {"train": 4, "validation": 2, "test": 2}},
}


def write_conf(directory: Path, **section: Any) -> Path:
    section.setdefault("environments", FAST_ENVIRONMENTS)
    path = directory / "env_service.yaml"
    path.write_text(yaml.safe_dump({"env_service": section}))
    return path


@contextlib.contextmanager
def env_server(directory: Path, **section: Any) -> Iterator[ServiceProcess]:
    conf = write_conf(directory, **section)
    with run_service("env_service", ["--conf", str(conf), "--log-level", "WARNING"]) as service:
        yield service
