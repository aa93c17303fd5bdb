"""Config: compose YAML with OmegaConf, apply `key=value` overrides, validate into pydantic models.

A run is described by one YAML file. Composition: a top-level `defaults:` list names other YAML
files (relative to the including file) merged underneath it, Hydra style. Interpolation
(`${trainer.lr}`, `${oc.env:VAR,default}`) is OmegaConf's. Validation errors name the full key
path and, where they are known, the allowed keys or values.
Precedence (highest first): command-line flags, the YAML, environment variables and defaults.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

if TYPE_CHECKING:
    from omegaconf import DictConfig

M = TypeVar("M", bound=BaseModel)

# Keys that look like secrets may not be set from YAML: secrets come only from the environment.
SECRET_KEY = re.compile(r"(^|_)(api_key|apikey|token|secret|password)$", re.IGNORECASE)


class ConfigError(ValueError):
    """A configuration problem, with a message that names the key path to fix."""


class StrictModel(BaseModel):
    """Base for config sections: unknown keys fail instead of being ignored."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


def load_dotenv_file(path: str | os.PathLike | None = None) -> None:
    """Load `.env` (from the working directory unless given) without overriding set variables."""
    from dotenv import load_dotenv

    target = Path(path) if path else Path.cwd() / ".env"
    if target.is_file():
        load_dotenv(target, override=False)


def _load_composed(path: Path, seen: tuple[Path, ...] = ()) -> DictConfig:
    # OmegaConf on first use: the settings models and `validate` serve code that reads no YAML (the device check).
    from omegaconf import DictConfig, ListConfig, OmegaConf

    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{path}: `defaults` includes itself through {' -> '.join(map(str, seen))}")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        node = OmegaConf.load(path)
    except Exception as exc:  # yaml.YAMLError and OmegaConf errors: report the file
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(node).__name__}")
    defaults = node.pop("defaults", None)
    if defaults is None:
        return node
    if not isinstance(defaults, ListConfig):
        raise ConfigError(f"{path}: `defaults` must be a list of YAML files")
    merged = OmegaConf.create({})
    for item in defaults:
        if item == "_self_":
            continue
        merged = OmegaConf.merge(merged, _load_composed(path.parent / str(item), (*seen, path)))
    return OmegaConf.merge(merged, node)  # type: ignore[return-value]


def compose(path: str | os.PathLike | None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Load a YAML file (with `defaults`), apply `a.b=c` overrides, resolve, return plain data."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    node = _load_composed(Path(path)) if path else OmegaConf.create({})
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(f"overrides must look like key.path=value, got: {', '.join(bad)}")
    if overrides:
        try:
            node = OmegaConf.merge(node, OmegaConf.from_dotlist(list(overrides)))
        except OmegaConfBaseException as exc:
            raise ConfigError(f"bad override: {exc}") from exc
    try:
        data = OmegaConf.to_container(node, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"cannot resolve interpolation at {getattr(exc, 'full_key', '?')}: {exc}") from exc
    _reject_secrets(data)
    return data  # type: ignore[return-value]


def _reject_secrets(data: Any, prefix: str = "") -> None:
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if SECRET_KEY.search(str(key)) and value not in (None, ""):
                raise ConfigError(
                    f"{path}: secrets may not be set in YAML; put it in the environment or .env "
                    f"(use a `*_env` key naming the variable instead)"
                )
            _reject_secrets(value, path)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            _reject_secrets(value, f"{prefix}[{i}]")


def _model_at(model: type[BaseModel], loc: Iterable[Any]) -> type[BaseModel] | None:
    """The pydantic model class found by walking `loc` through nested fields (best effort)."""
    current: Any = model
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        if isinstance(part, int):
            continue
        field = current.model_fields.get(str(part))
        if field is None:
            return current
        current = _unwrap(field.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """Find a BaseModel inside Optional[...] / list[...] / dict[str, ...] annotations."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _unwrap(arg)
        if isinstance(found, type) and issubclass(found, BaseModel):
            return found
    return annotation


def format_validation_error(exc: ValidationError, model: type[BaseModel], root: str = "") -> str:
    lines = []
    for err in exc.errors():
        loc = [p for p in err["loc"]]
        path = ".".join(str(p) for p in ([root] if root else []) + loc) or "<root>"
        if err["type"] == "extra_forbidden":
            parent = _model_at(model, loc[:-1])
            allowed = sorted(parent.model_fields) if parent else []
            lines.append(f"{path}: unknown key" + (f" (allowed keys: {', '.join(allowed)})" if allowed else ""))
        else:
            lines.append(f"{path}: {err['msg']} (got {err.get('input')!r})")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def validate(model: type[M], data: Any, root: str = "") -> M:
    """Validate plain data into `model`, raising ConfigError with full key paths."""
    try:
        return model.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, model, root)) from None


def load_config(
    model: type[M], path: str | os.PathLike | None, overrides: Sequence[str] = (), section: str | None = None
) -> M:
    """Compose the YAML at `path`, take `section` (dotted) if given, and validate it into `model`."""
    data: Any = compose(path, overrides)
    if section:
        for part in section.split("."):
            data = data.get(part) if isinstance(data, dict) else None
            if data is None:
                break
    return validate(model, data or {}, root=section or "")


def apply_flags(settings: M, **flags: Any) -> M:
    """Return a copy of `settings` with every flag that was actually given (not None) applied."""
    given = {k: v for k, v in flags.items() if v is not None}
    if not given:
        return settings
    return validate(type(settings), {**settings.model_dump(), **given})
