"""`trainer.device` and `llm_server.device`: a GPU asked for and absent fails at start naming the setting, and
the trainer's Ray actor asks for the GPUs it will use (Ray hides the others from it)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from engine.device import DeviceUnavailable, resolve_device
from tests.helpers import REPO
from trainer.device import actor_gpus, actor_options

NO_GPU = not torch.cuda.is_available()


@pytest.mark.parametrize(("device", "cluster_gpus", "gpus"), [
    ("auto", 0, 0), ("auto", 2, 1), ("cpu", 4, 0), ("cuda", 1, 1), ("cuda", 8, 1)])
def test_the_actor_asks_ray_for_the_gpu_it_will_use(device, cluster_gpus, gpus):
    options = actor_options(2.0, device, cluster_gpus, "TrainerActor")
    assert options == {"num_cpus": 2.0, "num_gpus": gpus, "name": "TrainerActor"}


def test_cuda_on_a_cluster_without_gpus_or_by_index_under_ray_names_the_setting():
    with pytest.raises(DeviceUnavailable, match=r"trainer.device: cuda but the Ray cluster has no GPU.*auto or cpu"):
        actor_gpus("cuda", 0)
    with pytest.raises(DeviceUnavailable, match=r"trainer.device: cuda:1 picks a GPU by index.*set trainer.device: cuda"):
        actor_gpus("cuda:1", 4)


@pytest.mark.skipif(not NO_GPU, reason="checks the refusal on a machine without a GPU")
def test_resolve_refuses_a_missing_gpu_and_auto_falls_back_to_cpu():
    assert resolve_device("auto", "x.device") == torch.device("cpu")
    assert resolve_device("cpu", "x.device") == torch.device("cpu")
    with pytest.raises(DeviceUnavailable, match=r"^x.device: cuda:1 but torch sees no CUDA GPU.*set x.device: auto or cpu"):
        resolve_device("cuda:1", "x.device")


@pytest.mark.skipif(not NO_GPU, reason="checks the refusal on a machine without a GPU")
def test_trainer_with_device_cuda_and_no_gpu_exits_at_start_naming_the_setting(tmp_path):
    conf = tmp_path / "run.yaml"
    conf.write_text("trainer:\n  model: tiny\n  device: cuda\n  rollout: {env: signal}\n"
                    "  services: {env_url: 'http://127.0.0.1:9'}\n  ray: {enabled: false}\n")
    done = subprocess.run([sys.executable, "-m", "trainer", "--conf", str(conf)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "trainer: trainer.device: cuda but torch sees no CUDA GPU" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_device_that_is_not_one_of_the_forms_is_refused_by_the_settings(tmp_path):
    from common.config import ConfigError, load_config
    from trainer.config import TrainerConfig

    conf = tmp_path / "run.yaml"
    conf.write_text("trainer:\n  device: gpu\n  rollout: {env: signal}\n  services: {env_url: 'http://127.0.0.1:9'}\n")
    with pytest.raises(ConfigError, match=r"trainer.device"):
        load_config(TrainerConfig, str(conf), [], section="trainer")


@pytest.mark.skipif(not NO_GPU, reason="checks the refusal on a machine without a GPU")
def test_llm_server_with_device_cuda_and_no_gpu_exits_at_start_naming_the_setting():
    from llm_server.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main(["--model", "tiny", "--device", "cuda", "--port", "0"])
    assert str(exited.value.code).startswith("llm_server: llm_server.device: cuda but torch sees no CUDA GPU")
