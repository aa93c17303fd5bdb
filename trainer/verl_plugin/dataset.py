"""The parquet veRL's dataloader reads: one row per task, pointing our agent loop at it.

veRL's `RLHFDataset` needs a `prompt` column; our agent loop ignores it (the environment service
renders the real first messages) and reads the task from `extra_info.evolver_task`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from common.schemas import Split, Task
from trainer.verl_plugin.settings import TASK_KEY, VERL_AGENT_LOOP


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
