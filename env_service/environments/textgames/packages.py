"""Optional suite packages: fail at start, naming the extra that installs them."""

from __future__ import annotations

import importlib
from importlib import metadata
from types import ModuleType

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


def package_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
