"""The trainer as a Ray actor (`python -m trainer` with `ray.enabled`).

A light module on purpose: the driver imports it to start the actor, and the trainer's own modules (torch,
transformers) are imported in the actor alone, so the driver does not spend their import time before the
actor even starts.
"""

from __future__ import annotations

import asyncio
from typing import Any


class TrainerActorImpl:
    """The trainer as a Ray actor: visible on the dashboard, its logs forwarded by Ray."""

    def __init__(self, config: dict[str, Any]) -> None:
        from trainer.config import TrainerConfig

        self.config = TrainerConfig.model_validate(config)

    def run(self) -> dict[str, Any]:
        from trainer.local import LocalTrainer

        return asyncio.run(LocalTrainer(self.config).run())
