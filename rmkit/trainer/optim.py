"""Optimizer, learning-rate schedule and the optimizer step, shared by every training recipe."""

from __future__ import annotations

import math

import torch

from rmkit.config import OptimizerConfig, SchedulerConfig

NO_DECAY = "_no_decay"  # the suffix of a model's group of biases and norm weights


def parameter_groups(name: str, model: torch.nn.Module, cfg: OptimizerConfig) -> list[dict]:
    """AdamW parameter groups of `model`'s trainable parameters with `cfg`'s settings: `name` (matrices, decayed)
    and `<name>_no_decay` (biases and norm weights, 1-D tensors). The name is the group's `name` key."""
    params = [p for p in model.parameters() if p.requires_grad]
    settings = {"lr": cfg.lr, "betas": tuple(cfg.betas), "eps": cfg.eps}
    return [
        {"name": name, "params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay, **settings},
        {"name": name + NO_DECAY, "params": [p for p in params if p.ndim < 2], "weight_decay": 0.0, **settings},
    ]


def build_optimizer(model: torch.nn.Module, cfg: OptimizerConfig) -> torch.optim.AdamW:
    """AdamW over trainable parameters in the groups `policy` and `policy_no_decay` (biases and norm weights:
    no weight decay)."""
    return joint_optimizer({"policy": (model, cfg)})


def joint_optimizer(parts: dict[str, tuple[torch.nn.Module, OptimizerConfig]]) -> torch.optim.AdamW:
    """One AdamW over several named models, each with its own settings (`parameter_groups`: `<name>` and
    `<name>_no_decay`): PPO's `policy` and `critic` step together and sit in one checkpoint."""
    groups = [group for name, (model, cfg) in parts.items() for group in parameter_groups(name, model, cfg)]
    params = [p for group in groups for p in group["params"]]
    # The fused kernel (one pass over each tensor) exists on CPU and CUDA; the default per-tensor loop
    # on CPU spent ~20% of a MiniLM step in AdamW's elementwise ops (BENCHMARKS.md).
    fused = bool(params) and all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    first = next(iter(parts.values()))[1]
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


def model_of(group: dict) -> str:
    """The model a parameter group belongs to: its name without `_no_decay`."""
    return group["name"].removesuffix(NO_DECAY)


def learning_rate(optimizer: torch.optim.Optimizer, model: str) -> float:
    """The learning rate the next step of `model`'s groups uses (named, as `joint_optimizer` names them)."""
    rates = {group["lr"] for group in optimizer.param_groups if model_of(group) == model}
    if len(rates) != 1:
        known = sorted({model_of(group) for group in optimizer.param_groups})
        raise KeyError(f"no single learning rate for {model!r} among the optimizer's models {known}")
    return rates.pop()


def schedule_by_model(optimizer: torch.optim.Optimizer, factors: dict) -> torch.optim.lr_scheduler.LambdaLR:
    """A schedule whose multiplier for each group is `factors[<its model>](step)`."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, [factors[model_of(group)] for group in optimizer.param_groups])


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
