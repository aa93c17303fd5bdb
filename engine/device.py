"""The torch device a `device` setting names (`trainer.device`, `llm_server.device`): auto, cpu, cuda, cuda:N.

`auto` takes cuda when torch sees a GPU, else cpu; a GPU that is asked for and absent fails here, naming the
setting, before any model loads.
"""

from __future__ import annotations

from typing import Any

DEVICE_PATTERN = r"^(auto|cpu|cuda(:\d+)?)$"  # what the settings models accept


class DeviceUnavailable(ValueError):
    """The configured device does not exist here; the message names the setting and what to set instead."""


def resolve_device(name: str, setting: str) -> Any:
    """The torch device for the setting `setting` (its value `name`) in this process."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailable(f"{setting}: {name} but torch sees no CUDA GPU here (torch {torch.__version__}, "
                                    f"CUDA build {torch.version.cuda or 'none'}): set {setting}: auto or cpu")
        count = torch.cuda.device_count()
        if (device.index or 0) >= count:
            raise DeviceUnavailable(f"{setting}: {name} but torch sees {count} GPU(s) (cuda:0..cuda:{count - 1}): "
                                    "choose one of them")
    return device


def describe(device: Any) -> str:
    """`cuda:0 (NVIDIA H200)` or `cpu`: what a log line says was taken."""
    import torch

    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)
