"""Run YAML -> veRL Hydra overrides: they compose against veRL's real `ppo_trainer` config and read back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="veRL is installed by the `verl` extra")

import verl  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from common.config import compose as compose_yaml  # noqa: E402
from trainer.verl_plugin.overrides import hydra_value, translate  # noqa: E402
from trainer.verl_plugin.settings import TASK_MANAGER_FILES, advantage_settings, evolver_settings  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "overall_gpu.yaml"
VERL_CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")


def verl_config(overrides: list[str]):
    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def test_example_overrides_compose_into_verls_config():
    run = compose_yaml(EXAMPLE)
    config = verl_config(translate(run))
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert config.algorithm.adv_estimator == "evolver_adca_grpo"
    assert actor.policy_loss.loss_mode == "evolver_boosted"
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c) == (0.2, 0.28, 3.0)
    assert actor.use_kl_loss is True and actor.kl_loss_coef == 0.001
    assert rollout.agent.default_agent_loop == "evolver_env_agent" and rollout.n == 8
    assert rollout.tensor_model_parallel_size == 2
    assert config.trainer.v1.trainer_mode == "evolver_sync" and config.trainer.n_gpus_per_node == 8
    assert config.actor_rollout_ref.model.path.endswith("Qwen2.5-7B-Instruct")
    assert actor.ppo_mini_batch_size == 8 and config.data.train_batch_size == 32
    # Our nodes read back through the same functions the plugin uses on the cluster.
    settings = evolver_settings(config)
    assert settings.env_url == "http://127.0.0.1:8001" and settings.rollout.env == "flights"
    assert settings.experience is not None and settings.experience.workspace == "overall_gpu"
    assert settings.judge_url == "http://127.0.0.1:8005" and settings.clip_high_boosted == 0.6
    assert settings.rollout.experience_ratio == 0.5 and settings.rollout.template_options == {}
    advantage = advantage_settings(config.algorithm)
    assert advantage.estimator == "adca_grpo" and advantage.adca_grpo.alpha == 0.1
    assert advantage.adca_grpo.total_steps is None


def test_example_enables_all_three_mechanisms():
    config = verl_config(translate(compose_yaml(EXAMPLE)))
    settings = evolver_settings(config)
    # self-questioning: each step's batch from the task manager, pass rates back to its curriculum
    assert config.data.train_files == TASK_MANAGER_FILES and config.data.custom_cls.name == "EvolverTaskDataset"
    assert config.data.shuffle is False and config.data.dataloader_num_workers == 0
    assert config.data.evolver.task_url == "http://127.0.0.1:8002" and config.data.evolver.batch_size == 32
    assert settings.tasks is not None and settings.tasks.url == "http://127.0.0.1:8002" and settings.tasks.feedback
    # self-navigating: retrieval for half of each group, and the pool written back (summaries, usage feedback)
    assert settings.experience is not None and settings.rollout.experience_ratio == 0.5
    assert settings.experience.summarize and settings.experience.feedback
    # self-attributing: the judge, because the estimator declares it needs step labels
    assert settings.estimator == "adca_grpo" and settings.judge_url == "http://127.0.0.1:8005"


def test_urls_given_on_the_command_line_win_and_odd_strings_survive_quoting():
    run = compose_yaml(EXAMPLE)
    run["verl"]["model_path"] = "/models/it's a path: with spaces"
    config = verl_config(translate(run, env_url="http://10.0.0.5:9001", experience_url="http://10.0.0.5:9003"))
    assert config.actor_rollout_ref.model.path == "/models/it's a path: with spaces"
    assert config.evolver.env_url == "http://10.0.0.5:9001"
    assert config.evolver.experience.url == "http://10.0.0.5:9003"
    assert hydra_value([1, None, True, "a,b"]) == "[1,null,true,'a,b']"


def test_plain_grpo_without_services_beyond_the_environment():
    run = compose_yaml(EXAMPLE)
    run["trainer"]["advantage"] = {"estimator": "grpo", "grpo": {"std": "verl", "normalize_by_std": False}}
    run["trainer"]["rollout"]["experience_ratio"] = 0.0
    run["trainer"]["services"] = {"env_url": "http://127.0.0.1:8001"}
    run["verl"]["train_files"] = "runs/data/train.parquet"
    run["verl"]["extra_overrides"] = ["trainer.val_before_train=false"]
    config = verl_config(translate(run))
    assert config.data.train_files == "runs/data/train.parquet" and OmegaConf.select(config, "evolver.tasks") is None
    assert config.algorithm.adv_estimator == "evolver_grpo"
    assert config.algorithm.norm_adv_by_std_in_grpo is False
    assert OmegaConf.select(config, "evolver.experience") is None and config.evolver.judge_url is None
    assert config.trainer.val_before_train is False


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r.pop("verl"), "no `verl` section"),
    (lambda r: r["verl"].update(tensor_parallel=3), "tensor_parallel=3"),
    (lambda r: r["verl"].update(typo_key=1), "verl.typo_key"),
    (lambda r: r["trainer"]["services"].pop("judge_url"), "adca_grpo needs step labels"),
    (lambda r: r["trainer"]["services"].pop("task_url"), "no training tasks"),
    (lambda r: r["trainer"]["services"].pop("experience_url"), "experience_ratio"),
    (lambda r: r["trainer"]["rollout"].update(n=0), "trainer.rollout.n"),
    (lambda r: r["trainer"]["rollout"].update(max_context=20000), "max_context=20000"),
    (lambda r: (r["trainer"]["rollout"].update(experience_ratio=0), r["trainer"].setdefault("experience", {}).update(
        mode="action", ask_reward="paired_branch")), "ask_reward=paired_branch runs on the local trainer only"),
])
def test_bad_input_names_what_to_fix(change, message):
    run = compose_yaml(EXAMPLE)
    change(run)
    with pytest.raises(ValueError, match=message):
        translate(run)


def test_cli_prints_one_override_per_line():
    proc = subprocess.run([sys.executable, "-m", "trainer.verl_plugin", "overrides", "--conf", str(EXAMPLE),
                           "trainer.steps=7"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "trainer.total_training_steps=7" in lines
    assert "+evolver.rollout.env='flights'" in lines
    # the three mechanisms, as the plugin reads them on the cluster
    assert "data.train_files='evolver://task_manager'" in lines and "+evolver.tasks.feedback=true" in lines
    assert "+evolver.experience.summarize=true" in lines and "+evolver.experience.feedback=true" in lines
    assert "+evolver.judge_url='http://127.0.0.1:8005'" in lines


def test_cli_error_is_one_clear_line(capsys):
    from trainer.verl_plugin.__main__ import main

    assert main(["overrides", "--conf", str(EXAMPLE), "verl.tensor_parallel=3"]) == 2
    assert "tensor_parallel=3" in capsys.readouterr().err
