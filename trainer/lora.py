"""LoRA through `peft`: only low-rank adapters train; whoever serves the policy gets merged weights.

`wrap` puts adapters on a plain HF causal LM (the base weights freeze); `merged_state_dict` gives the
state dict of the plain model with every adapter folded into its base weight, without changing the
trained model, so an engine or server that holds the plain architecture can load it; `merged_copy`
is a plain model for export.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from trainer.settings import LoraSettings


def is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def wrap(model: torch.nn.Module, settings: LoraSettings) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=settings.target_modules, task_type="CAUSAL_LM")
    return get_peft_model(model, config)


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The plain model's tensors, each adapted weight = base + delta; `model` itself is left as it is."""
    if not is_peft(model):
        return model.state_dict()
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    out = {name.replace(".base_layer.", "."): tensor for name, tensor in base.state_dict().items()
           if "lora_" not in name}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            weight = module.get_base_layer().weight.detach().clone()
            for adapter in module.active_adapters:
                weight += module.get_delta_weight(adapter)
            out[f"{name}.weight"] = weight
    return out


class MergedView(torch.nn.Module):
    """What a policy's `load_weights` reads (`state_dict()`): the merged tensors of a LoRA model."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self._target = [model]  # a list keeps the model out of this module's own parameters

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return merged_state_dict(self._target[0])


def serving_view(model: torch.nn.Module) -> torch.nn.Module:
    """The model as a policy engine or server should load it: itself, or its merged view under LoRA."""
    return MergedView(model) if is_peft(model) else model


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A plain model (adapters merged) for export or for an engine that runs the plain architecture."""
    if not is_peft(model):
        return model
    return copy.deepcopy(model).merge_and_unload()
