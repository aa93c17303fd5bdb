"""What an advantage estimator is, declared once where its function is defined: `@estimator(...)`.

    @estimator("grpo", GrpoConfig)
    def grpo(batch, config, training_step) -> AdvantageResult: ...

The decorator attaches an `EstimatorSpec` (name, settings model, needs) to the function and returns the
function unchanged; it registers nothing. The catalog reads the specs: those of the built-in modules
(`estimators/builtin/`), of installed packages' entry points, and of `register_estimator`.
This module imports no torch, so the launcher can read a spec.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

Need = Literal["step_labels", "anchor_keys"]
NEEDS: tuple[Need, ...] = ("step_labels", "anchor_keys")
SPEC_ATTRIBUTE = "estimator_spec"  # where `@estimator` puts the spec on the function

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class EstimatorSpec:
    """What an estimator is: its name, its settings model, what it needs per step, and its function.

    `needs`: "step_labels" (judge GOOD/BAD per step: the trainer calls the judge once per batch) and/or
    "anchor_keys" (the state each step acted in). `fn` is the function itself; or `target`,
    "module:function", imported on `load()` (a package's entry point, whose math must not load with it).
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

    def load(self) -> Callable[..., Any]:
        """The estimator function (imports its module the first time)."""
        if self.fn is None:
            assert self.target is not None
            module, _, attr = self.target.partition(":")
            self.fn = getattr(importlib.import_module(module), attr)
        return self.fn


def estimator(name: str, config_model: type[BaseModel], *, needs: Iterable[str] = ()) -> Callable[[F], F]:
    """Decorator: declare `fn(batch, config, training_step) -> AdvantageResult` as estimator `name`.

    `needs` declares what the estimator reads beyond outcomes and groups ("step_labels": the trainer
    then asks the judge once per batch; "anchor_keys").
    """

    def decorator(fn: F) -> F:
        setattr(fn, SPEC_ATTRIBUTE, EstimatorSpec(name, config_model, frozenset(needs), fn=fn))
        return fn

    return decorator


def spec_of(fn: Callable[..., Any]) -> EstimatorSpec | None:
    """The spec `@estimator` declared on `fn`, or None."""
    spec = getattr(fn, SPEC_ATTRIBUTE, None)
    return spec if isinstance(spec, EstimatorSpec) else None
