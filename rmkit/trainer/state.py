"""The loop's state in one place, and how a run starts (threads, seeds); the optimizer and schedule are in
`rmkit.trainer.optim`.

`rmkit.trainer.checkpointing.files` saves and restores a `TrainState` (with every rank's RNG) exactly.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import numpy as np
import torch


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


@dataclass
class TrainState:
    """Model, optimizer, scheduler, sampler, step and epoch of a run."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: object
    step: int = 0
    epoch: int = 0


def total_steps(loop, steps_per_epoch: int) -> int:
    """Optimizer steps of a run: `loop.max_num_epochs` epochs, capped by `loop.max_num_steps` when set (a recipe's
    loop section: `rm`, `sft`, `dpo`)."""
    steps = loop.max_num_epochs * steps_per_epoch
    return min(steps, loop.max_num_steps) if loop.max_num_steps else steps
