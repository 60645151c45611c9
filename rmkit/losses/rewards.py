"""What the RL recipes do to the rewards before any advantage: NeMo RL's reward scaling and reward shaping
(`ppo.reward_scaling`, `ppo.reward_shaping`; the same keys under `grpo.*`), as functions of tensors.

Scaling clamps each reward to `[source_min, source_max]` and maps that range linearly onto `[target_min,
target_max]`. Shaping (after DAPO, https://arxiv.org/abs/2503.14476) penalizes how a completion ended: with
`stop_properly_penalty_coef` a truncated completion keeps that share of its reward; otherwise a completion of
`L` tokens gets `min(0, -(L - (max_response_length - overlong_buffer_length)) / overlong_buffer_length *
overlong_buffer_penalty)` added (when all three overlong keys are set). Then TRL's `missing_eos_penalty` is
subtracted from every truncated completion's reward.
"""

from __future__ import annotations

import torch


def scale_rewards(rewards: torch.Tensor, source_min: float, source_max: float, target_min: float,
                  target_max: float) -> torch.Tensor:
    """`[N]` rewards clamped to the source range and mapped linearly onto the target range."""
    clamped = rewards.clamp(min=source_min, max=source_max)
    return target_min + (clamped - source_min) / (source_max - source_min) * (target_max - target_min)


def stop_properly_penalty(rewards: torch.Tensor, truncated: torch.Tensor, coef: float) -> torch.Tensor:
    """A truncated completion's reward multiplied by `coef` (in [0, 1]); the others unchanged."""
    return torch.where(truncated.to(torch.bool), rewards * coef, rewards)


def missing_eos_penalty(rewards: torch.Tensor, truncated: torch.Tensor, penalty: float) -> torch.Tensor:
    """TRL's EOS trick: `penalty` subtracted from a truncated completion's reward; the others unchanged."""
    return rewards - penalty * truncated.to(rewards.dtype)


def overlong_penalty(rewards: torch.Tensor, lengths: torch.Tensor, overlong_buffer_length: int,
                     overlong_buffer_penalty: float, max_response_length: int) -> torch.Tensor:
    """DAPO's soft overlong punishment: 0 up to `max_response_length - overlong_buffer_length` tokens, then
    falling linearly by `overlong_buffer_penalty` per `overlong_buffer_length` tokens (unbounded beyond
    `max_response_length`, as NeMo RL has it), added to the rewards."""
    expected = max_response_length - overlong_buffer_length
    exceed = lengths.to(rewards.dtype) - expected
    return rewards + (-exceed / overlong_buffer_length * overlong_buffer_penalty).clamp(max=0)
