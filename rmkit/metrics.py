"""Reward-model validation metrics (NeMo Aligner's), accumulated over batches and ranks."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rmkit.distributed import all_gather_cat

METRIC_KEYS = (
    "loss",
    "acc",
    "rewards_chosen_mean",
    "rewards_rejected_mean",
    "rewards_all_mean",
    "rewards_all_std",
    "num_pairs",
)


def reward_model_metrics(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> dict[str, float]:
    """Validation metrics of a reward model on N preference pairs.

    Args:
        chosen_rewards: `[N]` (or `[N, 1]`) rewards of the chosen responses.
        rejected_rewards: `[N]` (or `[N, 1]`) rewards of the rejected responses.

    Returns:
        `loss` (mean `-logsigmoid(r_c - r_r)`), `acc` (fraction with `r_c > r_r`; a tie is wrong),
        `rewards_chosen_mean`, `rewards_rejected_mean`, `rewards_all_mean` and `rewards_all_std`
        (unbiased, over the 2N rewards together; NaN when 2N < 2), and `num_pairs` (an int).
        Computed in float64.
    """
    chosen = chosen_rewards.detach().reshape(-1).double()
    rejected = rejected_rewards.detach().reshape(-1).double()
    if chosen.shape != rejected.shape:
        raise ValueError(
            f"chosen {tuple(chosen.shape)} and rejected {tuple(rejected.shape)} rewards differ in size"
        )
    if chosen.numel() == 0:
        raise ValueError("reward_model_metrics needs at least one pair")
    everything = torch.cat([chosen, rejected])
    return {
        "loss": (-F.logsigmoid(chosen - rejected)).mean().item(),
        "acc": (chosen > rejected).double().mean().item(),
        "rewards_chosen_mean": chosen.mean().item(),
        "rewards_rejected_mean": rejected.mean().item(),
        "rewards_all_mean": everything.mean().item(),
        "rewards_all_std": everything.std().item(),
        "num_pairs": int(chosen.numel()),
    }


class RewardMetricsAccumulator:
    """Collects chosen / rejected rewards over many batches; `compute()` gives `reward_model_metrics`.

    Under torch.distributed, `compute()` all-gathers every rank's rewards (ranks may hold different
    numbers of pairs) so that every rank gets the metrics of the concatenated data, exactly as one
    process would compute them. All ranks must call `compute()`.
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self._pairs: list[torch.Tensor] = []

    def update(self, chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> None:
        """Add `[n]` chosen and `[n]` rejected rewards (kept on the CPU in float64)."""
        chosen = chosen_rewards.detach().reshape(-1).double().cpu()
        rejected = rejected_rewards.detach().reshape(-1).double().cpu()
        if chosen.shape != rejected.shape:
            raise ValueError(
                f"chosen {tuple(chosen.shape)} and rejected {tuple(rejected.shape)} rewards differ in size"
            )
        self._pairs.append(torch.stack([chosen, rejected], dim=1))

    def compute(self) -> dict[str, float]:
        """Metrics over everything added (on every rank, when distributed)."""
        pairs = torch.cat(self._pairs) if self._pairs else torch.zeros((0, 2), dtype=torch.float64)
        pairs = all_gather_cat(pairs)  # [all ranks' pairs, 2], in rank order
        return reward_model_metrics(pairs[:, 0], pairs[:, 1])
