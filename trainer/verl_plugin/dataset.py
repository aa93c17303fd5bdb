"""What veRL's dataloader reads: one row per task, pointing our agent loop at it.

Rows carry a `prompt` column (veRL's `RLHFDataset` needs it; our agent loop ignores it, the environment
service renders the real first messages) and the task in `extra_info.evolver_task`. They come from the
task manager step by step (`EvolverTaskDataset`, self-questioning with its curriculum) or from a parquet
written once (`write_parquet`: the validation split, or a run without a task manager).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field
from torch.utils.data import Dataset

from common.config import StrictModel, validate
from common.schemas import Split, Task
from trainer.verl_plugin.settings import (
    TASK_KEY,
    TASK_MANAGER_FILES,
    VALIDATION_KEY,
    VERL_AGENT_LOOP,
    plain_node,
)


def task_rows(tasks: Sequence[Task]) -> list[dict]:
    return [{
        "data_source": f"evolver/{task.env_type}",
        "prompt": [{"role": "user", "content": task.query or task.task_id}],
        "agent_name": VERL_AGENT_LOOP,
        "extra_info": {TASK_KEY: json.dumps(task.model_dump(mode="json")), "index": i},
    } for i, task in enumerate(tasks)]


def write_parquet(tasks: Sequence[Task], out: str | Path) -> Path:
    import pandas as pd

    if not tasks:
        raise ValueError("no tasks to write: the environment has none in that split")
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(task_rows(tasks)).to_parquet(path)
    return path


async def env_tasks(env_url: str, env: str, split: Split, limit: int | None = None) -> list[Task]:
    """The environment's own tasks of a split, from the env service."""
    from env_service.client import EnvClient

    async with EnvClient(env_url) as client:
        ids = await client.task_ids(env, split)
    ids = ids[:limit] if limit else ids
    return [Task(task_id=t, env_type=env, split=split) for t in ids]


# ---------------------------------------------------------------- the dataset class veRL instantiates

class TaskSourceSettings(StrictModel):
    """`data.evolver`: where the training batches come from when `data.train_files` is the task manager."""

    env: str = Field(min_length=1)
    batch_size: int = Field(ge=1, description="tasks per step (data.train_batch_size)")
    steps: int = Field(ge=1, description="training steps: the dataset has steps x batch_size rows")
    seed: int = 0
    task_url: str | None = None
    synthetic_ratio: float | None = Field(default=None, ge=0, le=1)
    timeout_s: float = Field(default=120.0, gt=0)
    outage_budget_s: float = Field(default=120.0, ge=0, description="wait this long for a task manager that is down")
    logs_dir: str | None = Field(default=None, description="where the task manager logs: named in errors")


class EvolverTaskDataset(Dataset):
    """veRL's dataset (`data.custom_cls`): one item per task, in the shape veRL's collate_fn expects.

    With `data.train_files=evolver://task_manager`, item i belongs to step i // batch_size, and the first
    item of a step asks the task manager for that step's batch (original and synthetic tasks by its
    mixture and curriculum, seeded like the local trainer's step). veRL's dataloader reads items in
    order (`data.shuffle=false`) in the trainer process (`dataloader_num_workers=0`), so each batch is
    asked for after the previous step's pass rates went back. Other `data_files` are parquets written by
    `python -m trainer.verl_plugin dataset` (the validation split, or fixed tasks without a task manager).
    """

    def __init__(self, data_files: Any, tokenizer: Any = None, processor: Any = None, config: Any = None,
                 max_samples: int = -1, **_: Any) -> None:
        files = [data_files] if isinstance(data_files, str) else [str(f) for f in (data_files or [])]
        self.settings: TaskSourceSettings | None = None
        self.rows: list[dict[str, Any]] = []
        self._batch: tuple[int, list[dict[str, Any]]] | None = None
        self._loop: Any = None
        if files == [TASK_MANAGER_FILES]:
            raw = plain_node(config, "evolver")
            if raw is None:
                raise ValueError(f"data.train_files={TASK_MANAGER_FILES} needs the data.evolver node: start the run "
                                 "with the overrides of `python -m trainer.verl_plugin overrides`")
            self.settings = validate(TaskSourceSettings, raw, root="data.evolver")
            if not self.settings.task_url:
                raise ValueError(f"data.train_files={TASK_MANAGER_FILES} needs data.evolver.task_url")
        else:
            import pandas as pd

            for path in files:
                self.rows += pd.read_parquet(path).to_dict("records")
            if max_samples and max_samples > 0:
                self.rows = self.rows[:max_samples]

    def __len__(self) -> int:
        if self.settings is not None:
            return self.settings.steps * self.settings.batch_size
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self.settings is None:
            return verl_item(self.rows[index], index)
        step, position = divmod(int(index), self.settings.batch_size)
        if self._batch is None or self._batch[0] != step:
            self._batch = (step, task_rows(self._sample(step)))
        return verl_item(self._batch[1][position], index)

    def _sample(self, step: int) -> list[Task]:
        from trainer.mechanisms import LoopThread, step_batch_seed
        from trainer.peers import OutagePolicy, TaskPeer

        s = self.settings
        assert s is not None and s.task_url is not None
        if self._loop is None:
            self._loop = LoopThread()
            self._peer = TaskPeer(s.task_url, synthetic_ratio=s.synthetic_ratio, timeout=s.timeout_s,
                                  outage=OutagePolicy(budget_s=s.outage_budget_s, logs_dir=s.logs_dir))
        tasks = self._loop.run(self._peer.sample(s.batch_size, s.env, seed=step_batch_seed(s.seed, step)))
        if len(tasks) != s.batch_size:
            raise RuntimeError(f"the task manager returned {len(tasks)} tasks for a batch of {s.batch_size}")
        return tasks


def verl_item(row: dict[str, Any], index: int) -> dict[str, Any]:
    """A task row as veRL's RLHFDataset item: `raw_prompt` (the agent loop ignores it), our `extra_info`."""
    import torch

    prompt = row["prompt"]
    return {
        "raw_prompt": [dict(m) for m in prompt], "data_source": row["data_source"], "agent_name": row["agent_name"],
        "extra_info": dict(row["extra_info"]), "index": index, "tools_kwargs": {}, "interaction_kwargs": {},
        "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
    }


class ValidationBatches:
    """veRL's validation dataloader with every batch's rows marked `VALIDATION_KEY: True` (a non-tensor column,
    which veRL passes to the agent loop as a keyword like `uid`), so held-out rollouts run without experience
    and without asks, as the local trainer's evaluation does."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __iter__(self) -> Any:
        import numpy as np

        for batch in self.loader:
            rows = len(batch["raw_prompt"]) if "raw_prompt" in batch else len(batch["extra_info"])
            batch[VALIDATION_KEY] = np.full(rows, True, dtype=object)
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:  # the rest of the dataloader's surface (state_dict, dataset...)
        return getattr(self.loader, name)
