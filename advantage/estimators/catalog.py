"""The estimator catalog: every advantage estimator's name, settings model and needs, without torch.

This is the single source of truth the trainer config, the launcher, the mechanisms layer and the
veRL plugin read. It imports no torch: the launcher validates a run's estimator name against it and
asks what the estimator needs (step labels from the judge, anchor keys) without loading the math.
The math is imported lazily, on the first `EstimatorSpec.load()`.

Where estimators come from:
- the built-ins below (their functions live in `grpo.py`, `adca.py`, `gigpo.py`);
- the entry-point group `evolver.estimators` of any installed package: `name = "pkg.module:SPEC"`,
  where SPEC is an `EstimatorSpec` (keep that module's top level free of torch, so the launcher stays
  light; the function it names is imported only when the estimator runs);
- `register_estimator(name, config_model, needs=...)` (in `registry.py`), in the process that trains.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Literal

from loguru import logger
from pydantic import BaseModel

from advantage.estimators.config import AdcaGrpoConfig, GigpoConfig, GrpoConfig

Need = Literal["step_labels", "anchor_keys"]
NEEDS: tuple[Need, ...] = ("step_labels", "anchor_keys")
ENTRY_POINT_GROUP = "evolver.estimators"
VERL_PREFIX = "evolver_"  # our names in veRL's registry: veRL refuses to re-register its own `grpo`


@dataclass
class EstimatorSpec:
    """What an estimator is: its name, its settings model, what it needs per step, and its function.

    `needs`: "step_labels" (judge GOOD/BAD per step: the trainer calls the judge once per batch) and/or
    "anchor_keys" (the state each step acted in). `target` is "module:function", imported on `load()`;
    or `fn` is given directly (an estimator registered in-process).
    """

    name: str
    config_model: type[BaseModel]
    needs: frozenset[str] = frozenset()
    target: str | None = None
    fn: Callable[..., Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.needs = frozenset(self.needs)
        unknown = sorted(self.needs - set(NEEDS))
        if unknown:
            raise ValueError(f"estimator {self.name!r} declares unknown needs {unknown}; known: {list(NEEDS)}")
        if self.fn is None and self.target is None:
            raise ValueError(f"estimator {self.name!r} needs a function or a 'module:function' target")

    @property
    def needs_step_labels(self) -> bool:
        return "step_labels" in self.needs

    @property
    def verl_name(self) -> str:
        return verl_name(self.name)

    def load(self) -> Callable[..., Any]:
        """The estimator function (imports its module the first time)."""
        if self.fn is None:
            assert self.target is not None
            module, _, attr = self.target.partition(":")
            self.fn = getattr(importlib.import_module(module), attr)
        return self.fn


_BUILTIN = (
    EstimatorSpec("grpo", GrpoConfig, frozenset(), "advantage.estimators.grpo:grpo"),
    EstimatorSpec("adca_grpo", AdcaGrpoConfig, frozenset({"step_labels"}), "advantage.estimators.adca:adca_grpo"),
    EstimatorSpec("gigpo", GigpoConfig, frozenset({"anchor_keys"}), "advantage.estimators.gigpo:gigpo"),
)
BUILTIN_NAMES = frozenset(spec.name for spec in _BUILTIN)

_CATALOG: dict[str, EstimatorSpec] = {spec.name: spec for spec in _BUILTIN}
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
    if spec.fn is not None and existing.fn is None and existing.target == _target_of(spec.fn):
        existing.fn = spec.fn  # the built-in module's decorator binding its own function
        return existing
    same_fn = spec.fn is not None and existing.fn is spec.fn
    same_target = spec.target is not None and spec.target == existing.target
    if (same_fn or same_target) and spec.config_model is existing.config_model and spec.needs == existing.needs:
        return existing
    raise ValueError(f"advantage estimator {spec.name!r} is already registered "
                     f"({existing.target or _target_of(existing.fn)})")


def _target_of(fn: Callable[..., Any] | None) -> str | None:
    return None if fn is None else f"{fn.__module__}:{fn.__qualname__}"


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
