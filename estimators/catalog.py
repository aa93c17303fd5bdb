"""The estimator catalog: every advantage estimator's name, settings model and needs, without torch.

This is the single source of truth the trainer config, the launcher, the mechanisms layer and the
veRL plugin read. It imports no torch: the launcher validates a run's estimator name against it and
asks what the estimator needs (step labels from the judge, anchor keys) without loading the math.

Where estimators come from, each declared once by its `EstimatorSpec` (`spec.py`):
- the built-ins: every `@estimator` function of the modules in `estimators/builtin/`
  (torch-free at import; torch loads when an estimator runs);
- the entry-point group `evolver.estimators` of any installed package: `name = "pkg.module:SPEC"`,
  where SPEC is an `EstimatorSpec` (keep that module's top level free of torch, so the launcher stays
  light; the function it names is imported only when the estimator runs);
- `register_estimator(name, config_model, needs=...)` (in `registry.py`), in the process that trains.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from loguru import logger

from estimators import builtin
from estimators.spec import EstimatorSpec, spec_of

ENTRY_POINT_GROUP = "evolver.estimators"
VERL_PREFIX = "evolver_"  # our names in veRL's registry: veRL refuses to re-register its own `grpo`


def declared_in(module: ModuleType) -> list[EstimatorSpec]:
    """The specs of the `@estimator` functions defined in `module` (not those it imports)."""
    return [spec for value in vars(module).values()
            if callable(value) and getattr(value, "__module__", None) == module.__name__
            and (spec := spec_of(value)) is not None]


def builtin_specs(package: ModuleType = builtin) -> tuple[EstimatorSpec, ...]:
    """The estimators declared in the modules of `package` (the built-ins), in module-name order."""
    specs: list[EstimatorSpec] = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        specs += declared_in(importlib.import_module(f"{package.__name__}.{info.name}"))
    return tuple(specs)


BUILTINS = builtin_specs()
BUILTIN_NAMES = frozenset(spec.name for spec in BUILTINS)

_CATALOG: dict[str, EstimatorSpec] = {}
_entry_points_loaded = False


def _load_entry_points() -> None:
    """Add the estimators other installed packages declare (once per process)."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            spec = ep.load()
        except Exception as exc:  # one broken package must not hide the other estimators
            logger.warning("estimator entry point {} = {} failed to load: {}", ep.name, ep.value, exc)
            continue
        if not isinstance(spec, EstimatorSpec) or spec.name != ep.name:
            logger.warning("estimator entry point {} = {} is not an EstimatorSpec named {!r}; skipped",
                           ep.name, ep.value, ep.name)
            continue
        add(spec)


def add(spec: EstimatorSpec) -> EstimatorSpec:
    """Put `spec` in the catalog. Re-adding the same estimator is a no-op; a different one under a
    taken name is an error (two estimators must never silently share a name)."""
    existing = _CATALOG.get(spec.name)
    if existing is None:
        _CATALOG[spec.name] = spec
        return spec
    same_fn = spec.fn is not None and existing.fn is spec.fn
    same_target = spec.target is not None and spec.target == existing.target
    if (same_fn or same_target) and spec.config_model is existing.config_model and spec.needs == existing.needs:
        return existing
    raise ValueError(f"advantage estimator {spec.name!r} is already registered "
                     f"({existing.target or _target_of(existing.fn)})")


def _target_of(fn: Callable[..., Any] | None) -> str | None:
    return None if fn is None else f"{fn.__module__}:{fn.__qualname__}"


for _spec in BUILTINS:
    add(_spec)  # two built-ins under one name fail here, at import


def get_spec(name: str) -> EstimatorSpec:
    if name not in _CATALOG:
        _load_entry_points()
    try:
        return _CATALOG[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {', '.join(names())}") from None


def names() -> list[str]:
    _load_entry_points()
    return sorted(_CATALOG)


def needs(name: str) -> frozenset[str]:
    return get_spec(name).needs


def verl_name(name: str) -> str:
    """Our estimator `name` as registered in veRL (`evolver_<name>`)."""
    return VERL_PREFIX + name


def from_verl_name(verl: str) -> str | None:
    """Our estimator behind a veRL `adv_estimator` name, or None when it is not one of ours."""
    if not verl.startswith(VERL_PREFIX):
        return None
    name = verl.removeprefix(VERL_PREFIX)
    return name if name in names() else None
