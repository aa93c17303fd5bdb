"""Checks on a run's environments before anything starts, each failure one line that says what to fix.

In `build_plan` (so `--dry-run` too): every enabled environment's settings (unknown keys included,
`remote.urll` say) and that the environments the trainer and the task manager ask for are ones the
env service of this run serves. Before the launcher starts a process, and in `--dry-run`: every plugin
module imports in the env service's own environment, its class exists and is an `Environment`, and its
section passes the settings model the class declares. Before a launch only: every `remote` server answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from common.config import ConfigError
from env_service.settings import BUILTIN_ENVIRONMENTS, EnvServiceSettings, validate_environment_configs

PROBE_TIMEOUT_S = 5.0
IMPORT_TIMEOUT_S = 120.0


def check_environment_section(section: EnvServiceSettings) -> None:
    """The settings of each enabled environment, and that each has a class to serve it."""
    known = {*BUILTIN_ENVIRONMENTS, *section.plugins}
    for name in section.environments:
        if name not in known:
            raise ConfigError(f"env_service.environments.{name}: unknown environment; known: "
                              f"{', '.join(sorted(known))} (add others under env_service.plugins as "
                              f"name: 'module:Class')")
    validate_environment_configs(section.environments)


def check_served(section: EnvServiceSettings, trainer_env: str | None, task_manager_envs: list[str]) -> None:
    """The trainer's and the task manager's environments are among those this run's env service serves."""
    served = list(section.environments)
    wanted = ([("trainer.rollout.env", trainer_env)] if trainer_env else []) + [
        (f"task_manager.environments[{i}]", env) for i, env in enumerate(task_manager_envs)]
    for key, env in wanted:
        if env not in served:
            raise ConfigError(f"{key}: {env!r} is not served by this run's env_service (it serves "
                              f"{', '.join(served)}); enable it under env_service.environments or pick one of those")


def check_plugins(section: EnvServiceSettings, child_env: dict[str, str], cwd: Path) -> list[str]:
    """Plugins that would stop the env service at start: a module that does not import, a class it does not
    have, a section its settings model refuses."""
    return [p for name, spec in section.plugins.items()
            if (p := _plugin_problem(name, spec, section.environments.get(name), name in section.environments,
                                     child_env, cwd))]


def check_reachable(section: EnvServiceSettings, child_env: dict[str, str], cwd: Path) -> list[str]:
    """What would stop the env service from serving: plugins (`check_plugins`), remotes that do not answer."""
    problems = check_plugins(section, child_env, cwd)
    remote = section.environments.get("remote")
    if "remote" in section.environments and (problem := _remote_problem(dict(remote or {}))):
        problems.append(problem)
    return problems


# Run in the env service's own interpreter setup: import the module (an ImportError ends it with a traceback),
# then, for a plugin served as an environment, resolve its class and check its section as the service will.
_PLUGIN_CHECK = """
import importlib, json, sys
name, spec, config, served = json.loads(sys.argv[1])
importlib.import_module(spec.partition(":")[0])
if served:
    from common.config import ConfigError
    from env_service.registry import check_plugin
    try:
        check_plugin(name, {name: spec}, config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        sys.exit(3)
"""
_REFUSED = 3  # the module imports; the class or the section is wrong (the message says which)


def _plugin_problem(name: str, spec: str, config: dict[str, Any] | None, served: bool, child_env: dict[str, str],
                    cwd: Path) -> str | None:
    """Checked in a fresh interpreter with the env service's own PYTHONPATH and folder, as it will be."""
    module = spec.partition(":")[0]
    env = {**os.environ, **child_env}
    argument = json.dumps([name, spec, config or {}, served and ":" in spec])
    try:
        done = subprocess.run([sys.executable, "-c", _PLUGIN_CHECK, argument],
                              cwd=cwd, env=env, capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"env_service.plugins.{name}: importing {module} took over {IMPORT_TIMEOUT_S:.0f}s"
    if done.returncode == 0:
        return None
    if done.returncode == _REFUSED:
        return done.stderr.strip()
    last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    where = env.get("PYTHONPATH", "")
    return (f"env_service.plugins.{name}: cannot import {module}: {last}; put the module in the config "
            f"file's folder or the folder you launch from, or add its folder to PYTHONPATH (searched: {where})")


def _remote_problem(config: dict[str, Any]) -> str | None:
    url = config.get("url", "")
    try:
        httpx.get(f"{url}/healthz", timeout=min(float(config.get("timeout_s", PROBE_TIMEOUT_S)), PROBE_TIMEOUT_S))
    except httpx.HTTPError as exc:
        return (f"env_service.environments.remote.url: the remote env server {url} did not answer "
                f"({type(exc).__name__}: {exc}); start it first, or fix the url")
    return None
