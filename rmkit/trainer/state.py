"""The loop's state in one place, and the pieces it is built from (threads, seeds, optimizer, schedule).

`rmkit.trainer.checkpoint` saves and restores a `TrainState` (with every rank's RNG) exactly.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass

import numpy as np
import torch

from rmkit.config import OptimizerConfig, SchedulerConfig


def set_threads(num_threads: int | None) -> int:
    """torch intra-op threads from the config, else `RMKIT_NUM_THREADS`, else torch's default."""
    num_threads = num_threads or int(os.environ.get("RMKIT_NUM_THREADS", "0")) or None
    if num_threads:
        torch.set_num_threads(num_threads)
    return torch.get_num_threads()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_optimizer(model: torch.nn.Module, cfg: OptimizerConfig) -> torch.optim.AdamW:
    """AdamW over trainable parameters; biases and norm weights (1-D tensors) get no weight decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    # The fused kernel (one pass over each tensor) exists on CPU and CUDA; the default per-tensor loop
    # on CPU spent ~20% of a MiniLM step in AdamW's elementwise ops (BENCHMARKS.md).
    fused = bool(params) and all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=fused or None)


def lr_factor(step: int, cfg: SchedulerConfig, total_steps: int) -> float:
    """Multiplier of the peak lr before optimizer step `step` (0-based): linear warmup, then cosine to
    `min_lr_ratio` at `total_steps`, or constant."""
    warmup = max(cfg.warmup_steps, math.ceil(cfg.warmup_ratio * total_steps))
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if cfg.name == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: SchedulerConfig, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg, total_steps))


@dataclass
class TrainState:
    """Model, optimizer, scheduler, sampler, step and epoch of a run."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: object
    step: int = 0
    epoch: int = 0
