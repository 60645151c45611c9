"""GRPO / RLOO group-relative advantages."""

from __future__ import annotations

import torch


def grpo_group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    leave_one_out: bool = False,
    normalize_std: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Advantages of `group_size` responses per prompt: reward minus the group's baseline.

    GRPO (https://arxiv.org/abs/2402.03300) uses the group mean as the baseline and divides by the
    group's standard deviation; RLOO (https://arxiv.org/abs/2402.14740) uses the mean of the *other*
    responses (leave-one-out).

    Args:
        rewards: `[N]`, N = num_prompts * group_size; the responses to one prompt are consecutive.
        group_size: responses per prompt (>= 2 with leave_one_out).
        leave_one_out: baseline of response j = mean of the group without j.
        normalize_std: divide by (group std + eps), std unbiased over the whole group; groups whose
            std is 0 (all rewards equal) are left undivided (their advantages are 0 up to rounding).
        eps: added to the std.

    Returns:
        `[N]` advantages, same dtype as rewards; broadcast them over a sequence's tokens as needed.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [N], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    if leave_one_out and group_size < 2:
        raise ValueError("leave_one_out needs group_size >= 2")
    grouped = rewards.view(-1, group_size)
    if leave_one_out:
        baseline = (grouped.sum(-1, keepdim=True) - grouped) / (group_size - 1)
    else:
        baseline = grouped.mean(-1, keepdim=True)
    adv = grouped - baseline
    if normalize_std and group_size > 1:
        std = grouped.std(-1, keepdim=True)
        adv = torch.where(std > 0, adv / (std + eps), adv)
    return adv.reshape(-1)
