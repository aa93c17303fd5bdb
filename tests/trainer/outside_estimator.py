"""An advantage estimator defined outside the `advantage` package, as a user would add one: this file only.

`step_sign`: each step's advantage is `scale` times its judge label (GOOD=+1, BAD=-1), on the step's
tokens. It declares that it needs step labels, so the trainer asks the judge for them (once per batch)
and refuses a run without a judge, with nothing else changed anywhere.
"""

from __future__ import annotations

from pydantic import Field

from common.config import StrictModel
from estimators import AdvantageResult, register_estimator
from estimators.tokens import broadcast_steps


class StepSignConfig(StrictModel):
    scale: float = Field(default=1.0, gt=0)


@register_estimator("step_sign", StepSignConfig, needs=("step_labels",))
def step_sign(batch, config: StepSignConfig, training_step: int) -> AdvantageResult:
    per_step = [[config.scale * float(v) for v in row] for row in batch.step_labels]
    return AdvantageResult(advantages=broadcast_steps(batch, per_step), step_advantages=per_step)
