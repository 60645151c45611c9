"""Bradley-Terry pairwise preference loss over interleaved rewards `[c0, r0, c1, r1, ...]`."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from rmkit.losses.masking import compute_dtype, masked_mean


def split_pairs(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`[2N, ...]` interleaved rows -> (chosen `[N, ...]`, rejected `[N, ...]`)."""
    if values.shape[0] % 2:
        raise ValueError(f"interleaved pairs need an even number of rows, got {values.shape[0]}")
    return values[0::2], values[1::2]


def preference_terms(
    rewards: torch.Tensor,
    sample_mask: torch.Tensor,
    global_valid_seqs: torch.Tensor | float,
    beta: float = 1.0,
    margin: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The Bradley-Terry loss and its statistics, normalized by the global pair count.

    Args:
        rewards: `[2N]` interleaved rewards (chosen at even rows, rejected at odd rows).
        sample_mask: `[2N]`; a pair counts when both of its rows have mask 1.
        global_valid_seqs: valid rows over the global batch; pairs = global_valid_seqs / 2.
        beta: scale of the reward difference.
        margin: `[N]` or None; subtracted inside the sigmoid: `-logsigmoid(beta * (r_c - r_r) - m)`.

    Returns:
        dict of scalar tensors `loss`, `accuracy` (strict `>`, a tie is wrong), `rewards_chosen_mean`,
        `rewards_rejected_mean`, `num_pairs` (this microbatch's valid pairs, not normalized), and
        `pair_mask` `[N]`.
    """
    chosen, rejected = split_pairs(rewards)
    mask_c, mask_r = split_pairs(sample_mask)
    pair_mask = (mask_c * mask_r).to(chosen.dtype)
    logits = beta * (chosen - rejected)
    if margin is not None:
        logits = logits - margin.to(logits.dtype)
    pairs = torch.as_tensor(global_valid_seqs, dtype=chosen.dtype, device=chosen.device) / 2
    with torch.no_grad():
        accuracy = masked_mean((chosen > rejected).to(chosen.dtype), pair_mask, pairs)
        chosen_mean = masked_mean(chosen.detach(), pair_mask, pairs)
        rejected_mean = masked_mean(rejected.detach(), pair_mask, pairs)
    return {
        "loss": masked_mean(-F.logsigmoid(logits), pair_mask, pairs),
        "accuracy": accuracy,
        "rewards_chosen_mean": chosen_mean,
        "rewards_rejected_mean": rejected_mean,
        "num_pairs": pair_mask.sum(),
        "pair_mask": pair_mask,
    }


class PreferenceLoss:
    """Bradley-Terry reward-model loss: `-logsigmoid(beta * (r_c - r_r) - margin)`, mean over pairs.

    Called as `loss_fn(rewards, data, global_valid_seqs, global_valid_toks=None)` with `rewards`
    `[2N]` or `[2N, 1]` interleaved `[c0, r0, c1, r1, ...]` and `data["sample_mask"]` `[2N]`; an
    optional `data["margin"]` `[N]` is a per-pair margin (Llama 2's margin loss). The loss is
    normalized by the global pair count `global_valid_seqs / 2`.

    Args:
        beta: scale of the reward difference.
        center_rewards_coefficient: adds `coef * mean((r_c + r_r)^2)` over pairs (TRL's
            center_rewards_coefficient, https://arxiv.org/abs/2312.09244), keeping rewards centered.

    Metrics: `loss`, `accuracy`, `rewards_chosen_mean`, `rewards_rejected_mean`, `num_valid_samples`
    (valid pairs in this microbatch), plus `center_loss` when the coefficient is set.
    """

    def __init__(self, beta: float = 1.0, center_rewards_coefficient: float | None = None):
        if center_rewards_coefficient is not None and center_rewards_coefficient < 0:
            raise ValueError(f"center_rewards_coefficient must be >= 0, got {center_rewards_coefficient}")
        self.beta = beta
        self.center_rewards_coefficient = center_rewards_coefficient

    def __call__(
        self,
        rewards: torch.Tensor,
        data: dict[str, Any],
        global_valid_seqs: torch.Tensor | float,
        global_valid_toks: torch.Tensor | float | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if rewards.dim() == 2 and rewards.shape[1] == 1:
            rewards = rewards.squeeze(1)
        if rewards.dim() != 1:
            raise ValueError(f"PreferenceLoss expects rewards [2N] or [2N, 1], got {tuple(rewards.shape)}")
        rewards = rewards.to(compute_dtype(rewards))
        terms = preference_terms(
            rewards, data["sample_mask"], global_valid_seqs, self.beta, data.get("margin")
        )
        loss = terms["loss"]
        metrics = {}
        if self.center_rewards_coefficient:
            chosen, rejected = split_pairs(rewards)
            pairs = torch.as_tensor(global_valid_seqs, dtype=chosen.dtype, device=chosen.device) / 2
            center = masked_mean((chosen + rejected) ** 2, terms["pair_mask"], pairs)
            loss = loss + self.center_rewards_coefficient * center
            metrics["center_loss"] = center.detach()
        metrics = {
            "loss": loss.detach(),
            "accuracy": terms["accuracy"],
            "rewards_chosen_mean": terms["rewards_chosen_mean"],
            "rewards_rejected_mean": terms["rewards_rejected_mean"],
            "num_valid_samples": terms["num_pairs"].detach(),
            **metrics,
        }
        return loss, metrics
