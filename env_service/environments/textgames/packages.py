"""Optional suite packages: fail at start, naming the extra that installs them."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from importlib import metadata
from types import ModuleType
from typing import TypeVar

T = TypeVar("T")

EXTRA = "envs"


def require_package(module: str, distribution: str, env_name: str) -> ModuleType:
    """Import `module` or raise ValueError telling the operator how to install it.

    ValueError is what the registry turns into a ConfigError naming the environment, so the
    service refuses to start instead of failing on the first request.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(
            f"the '{env_name}' environment needs the '{distribution}' package ({exc}); install it with "
            f"pip install 'evolver[{EXTRA}]' (or re-run bash install.sh, which installs the {EXTRA} extra)"
        ) from exc


def quietly(call: Callable[[], T]) -> T:
    """`call()` with warnings silenced: suite packages warn each time an environment is made (deprecations,
    gymnasium's checks), which would fill the service's log once per episode."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return call()


def package_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
