"""The task parquet goes through veRL's own dataset class and comes back as the same tasks."""

from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="veRL is installed by the `verl` extra")

from omegaconf import OmegaConf  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402

from common.schemas import Task  # noqa: E402
from tests.verl.test_agent_loop import word_tokenizer  # noqa: E402
from trainer.verl_plugin.agent_loop import task_from_row  # noqa: E402
from trainer.verl_plugin.dataset import write_parquet  # noqa: E402


def test_rows_read_by_verls_dataset_become_our_tasks(tmp_path):
    tasks = [Task(task_id="signal-train-0000", env_type="signal"),
             Task(task_id="syn-1", env_type="signal", synthetic=True, seed_task_id="signal-train-0001",
                  query="look at the signal then answer north, south")]
    path = write_parquet(tasks, tmp_path / "train.parquet")
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 64, "return_raw_chat": True,
                               "filter_overlong_prompts": True, "cache_dir": str(tmp_path / "cache")})
    dataset = RLHFDataset(data_files=str(path), tokenizer=word_tokenizer(), config=config)
    rows = [dataset[i] for i in range(len(dataset))]
    assert [task_from_row(r) for r in rows] == tasks
    assert all(r["agent_name"] == "evolver_env_agent" for r in rows)
    assert task_from_row(rows[1]).create_params() == {"query": tasks[1].query}


def test_our_dataset_class_reads_the_parquet_into_items_verls_collate_takes(tmp_path):
    from verl.utils.dataset.rl_dataset import collate_fn

    from trainer.verl_plugin.dataset import EvolverTaskDataset

    tasks = [Task(task_id="signal-validation-0000", env_type="signal"),
             Task(task_id="signal-validation-0001", env_type="signal")]
    dataset = EvolverTaskDataset(str(write_parquet(tasks, tmp_path / "validation.parquet")), config=OmegaConf.create({}))
    items = [dataset[i] for i in range(len(dataset))]
    assert [task_from_row(item) for item in items] == tasks
    batch = collate_fn(items)
    assert list(batch["agent_name"]) == ["evolver_env_agent"] * 2 and batch["dummy_tensor"].shape[0] == 2


def test_the_task_manager_source_needs_its_settings():
    from trainer.verl_plugin.dataset import EvolverTaskDataset
    from trainer.verl_plugin.settings import TASK_MANAGER_FILES

    with pytest.raises(ValueError, match="data.evolver"):
        EvolverTaskDataset(TASK_MANAGER_FILES, config=OmegaConf.create({}))


def test_a_row_without_our_task_says_how_to_build_the_parquet():
    with pytest.raises(ValueError, match="trainer.verl_plugin dataset"):
        task_from_row({"extra_info": {"index": 0}})


def test_evolver_sync_marks_every_validation_row_and_no_training_row(tmp_path):
    """veRL's `_init_dataloader` as `evolver_sync` runs it: the validation batches reach the agent loop worker
    with `evolver_validate` on each row (a non-tensor column, handed to the agent loop like `uid`)."""
    import verl.utils.tensordict_utils as tu

    from trainer.verl_plugin.settings import VALIDATION_KEY
    from trainer.verl_plugin.trainer import EvolverPPOTrainer

    tasks = [Task(task_id=f"signal-validation-000{i}", env_type="signal") for i in range(3)]
    path = str(write_parquet(tasks, tmp_path / "tasks.parquet"))
    trainer = EvolverPPOTrainer.__new__(EvolverPPOTrainer)  # no Ray workers: only the dataloaders are built
    trainer.trainer_mode, trainer.parameter_sync_step, trainer.tokenizer, trainer.processor = "sync", 1, None, None
    trainer.config = OmegaConf.create({
        "data": {"train_files": path, "val_files": path, "train_batch_size": 3, "gen_batch_size": None,
                 "custom_cls": {"path": "pkg://trainer.verl_plugin.dataset", "name": "EvolverTaskDataset"},
                 "dataloader_num_workers": 0, "val_batch_size": None, "validation_shuffle": False, "shuffle": False,
                 "seed": 0},
        "algorithm": {}, "trainer": {"v1": {"sampler": {}}, "total_epochs": 1, "total_training_steps": 1},
        "actor_rollout_ref": {"actor": {"optim": {}}}})
    trainer._init_dataloader()
    [validation] = list(trainer.val_dataloader)
    [training] = list(trainer.train_dataloader)
    assert len(trainer.val_dataloader) == 1 and VALIDATION_KEY not in training
    rows = tu.get_tensordict(validation)[VALIDATION_KEY]
    assert [rows[i] for i in range(3)] == [True, True, True]
