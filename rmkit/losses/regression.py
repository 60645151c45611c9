"""Multi-attribute regression loss for reward heads with K outputs (HelpSteer style)."""

from __future__ import annotations

from typing import Any

import torch

from rmkit.data.records import MISSING_LABEL
from rmkit.losses.masking import compute_dtype, masked_mean


def regression_label_mask(labels: torch.Tensor, sample_mask: torch.Tensor | None = None) -> torch.Tensor:
    """`[B, K]` float mask: 1 where the label is not `MISSING_LABEL` (-100) and the row counts.

    Its sum over the global batch is the `global_valid_toks` that `RegressionLoss` expects.
    """
    mask = (labels != MISSING_LABEL).to(torch.float32)
    if sample_mask is not None:
        mask = mask * sample_mask.reshape(-1, 1).to(mask.dtype)
    return mask


class RegressionLoss:
    """Mean squared error between the reward head `[B, K]` and `labels [B, K]`, skipping -100 labels.

    Called as `loss_fn(rewards, data, global_valid_seqs, global_valid_toks)` where
    `data["labels"]` is `[B, K]` (-100 marks a missing attribute), `data["sample_mask"]` `[B]` is
    optional, and `global_valid_toks` is the global count of valid label entries (the sum of
    `regression_label_mask` over every microbatch and rank).

    Metrics: `loss`, `mae` (mean absolute error over the same entries), `num_valid_labels` (this
    microbatch), `num_valid_samples` (rows in this microbatch with a valid label).
    """

    def __call__(
        self,
        rewards: torch.Tensor,
        data: dict[str, Any],
        global_valid_seqs: torch.Tensor | float | None,
        global_valid_toks: torch.Tensor | float,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        labels = data["labels"]
        if rewards.dim() == 1:
            rewards = rewards[:, None]
        if labels.dim() == 1:
            labels = labels[:, None]
        if rewards.shape != labels.shape:
            raise ValueError(
                f"RegressionLoss: rewards {tuple(rewards.shape)} and labels {tuple(labels.shape)} differ"
            )
        dtype = compute_dtype(rewards)
        mask = regression_label_mask(labels, data.get("sample_mask")).to(dtype)
        labels = labels.to(dtype)
        diff = rewards.to(dtype) - torch.where(mask > 0, labels, torch.zeros_like(labels))
        loss = masked_mean(diff**2, mask, global_valid_toks)
        with torch.no_grad():
            metrics = {
                "loss": loss.detach(),
                "mae": masked_mean(diff.abs(), mask, global_valid_toks),
                "num_valid_labels": mask.sum(),
                "num_valid_samples": (mask.sum(-1) > 0).sum(),
            }
        return loss, metrics
