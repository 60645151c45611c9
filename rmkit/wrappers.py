"""DDP, `torch.compile` and peft LoRA wrap a model; these find what is inside, one function per use.

torch only (no transformers import), so the checkpoint code can unwrap any module.
"""

from __future__ import annotations

import torch


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DDP (`.module`) and `torch.compile` (`._orig_mod`) wrappers, the same object
    (for checkpoints: its parameter names are the model's own)."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def transformers_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model that `compute_rewards` reads: wrappers removed and, under LoRA, peft's
    base model, whose layers carry the adapters (training goes on through it; nothing is copied)."""
    model = unwrap_model(model)
    if hasattr(model, "get_base_model"):
        return model.get_base_model()
    return model


def merged_model(model: torch.nn.Module) -> torch.nn.Module:
    """A plain transformers model for export: wrappers removed and LoRA adapters merged into the weights
    (peft's `merge_and_unload`, which changes a peft model in place: pass a copy to keep training it)."""
    model = unwrap_model(model)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    return model
