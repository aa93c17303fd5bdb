"""Run metrics: one JSON line per record, TensorBoard scalars, and a PNG of the curves at the end.

A record is acknowledged once `log` returns; a resumed run first cuts off the half line a kill mid-write
may have left (`common.jsonl`), so its own records start on a line of their own.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from common.faults import TRAINER_FAULT_ENV, FaultInjector, check_disk
from common.jsonl import cut_torn_tail


class MetricsLog:
    def __init__(self, directory: str | Path, *, tensorboard: bool = True) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / "metrics.jsonl"
        cut_torn_tail(self.path)
        self.faults = FaultInjector(TRAINER_FAULT_ENV)
        self._logged = 0
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.directory / "tensorboard"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        check_disk(self.path)
        self._logged += 1
        with self.path.open("ab") as f:
            self.faults.write_record(f, (json.dumps(record) + "\n").encode(), "metrics", self._logged)
        if self._writer is not None:
            for key, value in metrics.items():
                if math.isfinite(float(value)):
                    self._writer.add_scalar(key, float(value), step)
            self._writer.flush()

    def records(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def plot(self, keys: tuple[str, ...] = ("rollout/reward_mean", "update/pg_loss", "update/clip_frac_unflagged",
                                             "update/entropy")) -> Path | None:
        """learning_curves.png: the given keys plus every eval/ metric, one panel each."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        records = self.records()
        present = [k for k in keys if any(k in r for r in records)]
        present += sorted({k for r in records for k in r if k.startswith("eval/") and k != "eval/tasks"})
        if not present:
            return None
        fig, axes = plt.subplots(len(present), 1, figsize=(7, 2.2 * len(present)), squeeze=False)
        for ax, key in zip(axes[:, 0], present, strict=True):
            points = [(r["step"], r[key]) for r in records if key in r]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o" if len(points) < 30 else None)
            ax.set_ylabel(key, fontsize=8)
            ax.grid(alpha=0.3)
        axes[-1, 0].set_xlabel("step")
        fig.tight_layout()
        out = self.directory / "learning_curves.png"
        fig.savefig(out, dpi=90)
        plt.close(fig)
        return out

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
