"""Optimizer, learning-rate schedule and the optimizer step, shared by every training recipe."""

from __future__ import annotations

import math

import torch

from rmkit.config import OptimizerConfig, SchedulerConfig


def parameter_groups(model: torch.nn.Module, cfg: OptimizerConfig) -> list[dict]:
    """AdamW parameter groups of `model`'s trainable parameters with `cfg`'s settings: matrices decayed, biases
    and norm weights (1-D tensors) not."""
    params = [p for p in model.parameters() if p.requires_grad]
    settings = {"lr": cfg.lr, "betas": tuple(cfg.betas), "eps": cfg.eps}
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay, **settings},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0, **settings},
    ]


def build_optimizer(model: torch.nn.Module, cfg: OptimizerConfig) -> torch.optim.AdamW:
    """AdamW over trainable parameters; biases and norm weights (1-D tensors) get no weight decay."""
    return joint_optimizer([(model, cfg)])


def joint_optimizer(parts: list[tuple[torch.nn.Module, OptimizerConfig]]) -> torch.optim.AdamW:
    """One AdamW over several models, each with its own settings (`parameter_groups`, two groups per model in
    order): PPO's policy and critic step together and sit in one checkpoint."""
    groups = [group for model, cfg in parts for group in parameter_groups(model, cfg)]
    params = [p for group in groups for p in group["params"]]
    # The fused kernel (one pass over each tensor) exists on CPU and CUDA; the default per-tensor loop
    # on CPU spent ~20% of a MiniLM step in AdamW's elementwise ops (BENCHMARKS.md).
    fused = bool(params) and all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    first = parts[0][1]
    return torch.optim.AdamW(groups, lr=first.lr, betas=tuple(first.betas), eps=first.eps, fused=fused or None)


def lr_factor(step: int, cfg: SchedulerConfig, total_steps: int) -> float:
    """Multiplier of the peak lr before optimizer step `step` (0-based): linear warmup, then cosine to
    `min_lr_ratio` at `total_steps`, or constant."""
    warmup = max(cfg.warmup_steps, math.ceil(cfg.warmup_ratio * total_steps))
    if step < warmup:
        if cfg.warmup_start_factor is None:
            return (step + 1) / (warmup + 1)
        return cfg.warmup_start_factor + (1 - cfg.warmup_start_factor) * step / warmup
    if cfg.name == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: SchedulerConfig, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg, total_steps))


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler,
                   max_grad_norm: float | None) -> torch.Tensor:
    """Clip, step, schedule, clear. Returns the pre-clip global gradient norm (a device tensor)."""
    grad_norm = clip_gradients(model, max_grad_norm)
    step_optimizer(optimizer, scheduler)
    return grad_norm


def clip_gradients(model: torch.nn.Module, max_grad_norm: float | None) -> torch.Tensor:
    """Clip the gradients of `model`'s parameters to a global norm of `max_grad_norm` (None: only measure).
    Returns the pre-clip norm (a device tensor)."""
    params = [p for p in model.parameters() if p.grad is not None]
    max_norm = max_grad_norm if max_grad_norm is not None else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor of the (replicated) global norm
        grad_norm = grad_norm.full_tensor()
    return grad_norm


def step_optimizer(optimizer: torch.optim.Optimizer, scheduler) -> None:
    """The optimizer step, the schedule's step, and the gradients cleared."""
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
