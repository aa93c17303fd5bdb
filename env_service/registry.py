"""Loading the allowlisted environments: names map to fixed `module:Class` paths, chosen by config only.

A request names an environment, and the server looks that name up among the environments it
loaded at start; nothing a request sends is ever imported. Operators may add their own
environment classes through the `plugins` config key (config is trusted, requests are not).
A plugin is `name: "module:Class"` (an Environment class served as `name`) or `name: "module"`
(imported at start for its side effects, e.g. a module that registers gymnasium ids, which the
`gym` environment can then serve by id).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from common.config import ConfigError, validate
from env_service.environments.base import Environment
from env_service.settings import BUILTIN_ENVIRONMENTS


def resolve_class(name: str, plugins: Mapping[str, str] | None = None) -> type[Environment]:
    """The Environment class registered as `name` (a built-in, or a plugin from config)."""
    known = {**BUILTIN_ENVIRONMENTS, **(plugins or {})}
    spec = known.get(name)
    if spec is None:
        raise ConfigError(f"env_service.environments.{name}: unknown environment; "
                          f"known: {', '.join(sorted(known))} (add others under env_service.plugins "
                          f"as name: 'module:Class')")
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ConfigError(f"env_service.environments.{name}: the plugin {spec!r} is import-only (no ':Class'); "
                          f"name an Environment class as 'module:Class' to serve it as {name!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"env_service.environments.{name}: cannot import {module_name}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        found = sorted(n for n, v in vars(module).items()
                       if isinstance(v, type) and issubclass(v, Environment) and v is not Environment)
        raise ConfigError(f"env_service.plugins.{name}: module {module_name} has no {class_name!r} "
                          f"({module.__file__}); its Environment classes: {', '.join(found) or 'none'}")
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ConfigError(f"env_service.plugins.{name}: {spec} is a {type(cls).__name__}, not an Environment "
                          "subclass (env_service.environments.base.Environment)")
    return cls


def check_settings(name: str, cls: type[Environment], config: Mapping[str, Any] | None) -> None:
    """An environment's section against the settings model it declares (`Environment.settings_model`)."""
    if cls.settings_model is not None:
        validate(cls.settings_model, dict(config or {}), root=f"env_service.environments.{name}")


def check_plugin(name: str, plugins: Mapping[str, str], config: Mapping[str, Any] | None) -> None:
    """What the service will do at start with plugin environment `name`: import its class, check its section.
    Raises ConfigError naming what to fix (the launcher runs this in the service's own Python path)."""
    check_settings(name, resolve_class(name, plugins), config)


def import_plugins(plugins: Mapping[str, str] | None) -> None:
    """Import every plugin module before any environment is built, so that what a module registers
    at import time (a gymnasium id, say) exists when an environment's config names it."""
    for name, spec in (plugins or {}).items():
        module_name = spec.partition(":")[0]
        if not module_name:
            raise ConfigError(f"env_service.plugins.{name}: expected 'module' or 'module:Class', got {spec!r}")
        try:
            importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError(f"env_service.plugins.{name}: cannot import {module_name}: {exc}") from exc


def load_environments(enabled: Mapping[str, Mapping[str, Any] | None],
                      plugins: Mapping[str, str] | None = None) -> dict[str, Environment]:
    """Import the plugins, then instantiate every enabled environment with its config section, in config order."""
    import_plugins(plugins)
    environments: dict[str, Environment] = {}
    for name, config in enabled.items():
        cls = resolve_class(name, plugins)
        check_settings(name, cls, config)
        try:
            environments[name] = cls(dict(config or {}))
        except ConfigError:
            raise  # it names its key path already
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"env_service.environments.{name}: {exc}") from exc
    return environments
