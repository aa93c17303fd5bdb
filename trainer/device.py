"""The GPUs the local trainer's Ray actor asks for, from `trainer.device` (the torch side: `engine.device`).

Ray hides every GPU from an actor that did not ask for one (it sets CUDA_VISIBLE_DEVICES to nothing), so
the actor's `num_gpus` and the device the trainer picks inside it must agree: `cuda` asks for one GPU and
fails at start when the cluster has none, rather than waiting for one forever; `auto` asks for one when the
cluster has one. Inside the actor, Ray's GPU is `cuda` (index 0 of what it sees), so `cuda:N` is refused there.
"""

from __future__ import annotations

from typing import Any

from engine.device import DeviceUnavailable

SETTING = "trainer.device"


def actor_gpus(device: str, cluster_gpus: float) -> int:
    """GPUs the trainer's Ray actor asks for under `trainer.device: device`, on a cluster holding `cluster_gpus`."""
    if device == "cpu":
        return 0
    if device == "auto":
        return 1 if cluster_gpus >= 1 else 0
    if device != "cuda":
        raise DeviceUnavailable(f"{SETTING}: {device} picks a GPU by index, but the Ray actor sees only the GPU Ray "
                                f"assigns it: set {SETTING}: cuda (or ray.enabled: false to pick one by index)")
    if cluster_gpus < 1:
        raise DeviceUnavailable(f"{SETTING}: cuda but the Ray cluster has no GPU (its resources list GPU: "
                                f"{cluster_gpus:g}): set {SETTING}: auto or cpu, or join a cluster with a GPU")
    return 1


def actor_options(num_cpus: float, device: str, cluster_gpus: float, name: str) -> dict[str, Any]:
    """The trainer actor's Ray options: its CPUs, the GPUs of `actor_gpus`, its name."""
    return {"num_cpus": num_cpus, "num_gpus": actor_gpus(device, cluster_gpus), "name": name}
