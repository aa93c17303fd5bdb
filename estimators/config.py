"""The `advantage` section of a run: which estimator, and the settings of each built-in.

Its fields derive from the catalog: one section per built-in estimator, named after it and typed by its
settings model (each declared once, beside its function in `builtin/`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, create_model, model_validator

from common.config import StrictModel, validate
from estimators import catalog


class _AdvantageSection(StrictModel):
    """The `advantage` section of a run: which estimator and the settings of each.

    `estimator` is any name in the estimator catalog (`estimators.catalog`): the built-ins
    have their own sections below; an estimator registered from outside the package reads its
    settings from `options.<name>` (validated by the settings model it registered).
    """

    estimator: str = "grpo"
    # `options` and the built-ins' sections are declared in `AdvantageConfig` below, in that order.

    @model_validator(mode="after")
    def _known_estimator(self) -> _AdvantageSection:
        spec = catalog.get_spec(self.estimator)  # ValueError naming the known estimators
        if self.estimator not in catalog.BUILTIN_NAMES:
            spec.config_model.model_validate(self.options.get(self.estimator, {}))
        return self

    @property
    def needs(self) -> frozenset[str]:
        """What the selected estimator declared it needs ("step_labels", "anchor_keys")."""
        return catalog.needs(self.estimator)

    @property
    def needs_step_labels(self) -> bool:
        return "step_labels" in self.needs

    def config_for(self, name: str) -> BaseModel:
        """The settings of estimator `name`: its section, or `options.<name>` for an outside one."""
        if name in catalog.BUILTIN_NAMES:
            return getattr(self, name)
        return validate(catalog.get_spec(name).config_model, self.options.get(name, {}),
                        root=f"advantage.options.{name}")

    def estimator_config(self) -> BaseModel:
        """The settings of the selected estimator."""
        return self.config_for(self.estimator)


AdvantageConfig = create_model(
    "AdvantageConfig", __base__=_AdvantageSection, __module__=__name__, __doc__=_AdvantageSection.__doc__,
    **{spec.name: (spec.config_model, Field(default_factory=spec.config_model)) for spec in catalog.BUILTINS},
    options=(dict[str, dict[str, Any]], Field(
        default_factory=dict, description="settings of estimators registered outside estimators/, by name")),
)
