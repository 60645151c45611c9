"""What the loop minimizes, per reward-model type, with DESIGN.md's global-count normalization.

Thin adapters over `rmkit.losses` that return device tensors only (the `LossFunction` objects return
Python floats, i.e. one host-device sync per metric per micro-batch, which the hot loop avoids). Each
loss is already divided by the *global* count, so summing the micro-batch losses of one optimizer step
gives the full-batch loss (micro-batch 1 x accumulation 8 == micro-batch 8 x accumulation 1).
"""

from __future__ import annotations

import torch

from rmkit.losses import masked_mean, regression_label_mask
from rmkit.losses.preference import preference_terms


def bradley_terry_loss(rewards: torch.Tensor, margin: torch.Tensor, sample_mask: torch.Tensor,
                       global_valid_seqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairwise loss `-log sigmoid(r_c - r_r - margin)` (InstructGPT eq. 1; margin as in Llama 2).

    Args:
        rewards: `[2N]` or `[2N, 1]` interleaved `[c0, r0, c1, r1, ...]`.
        margin: `[N]` required reward gap (0 where absent).
        sample_mask: `[2N]`; a pair counts when both its rows count.
        global_valid_seqs: scalar, valid rows of the whole global batch (2 x pairs).
    Returns:
        `(loss, correct)`: the loss summed over valid pairs / (global_valid_seqs / 2), and the number of
        valid pairs of this micro-batch with `r_c > r_r` strictly (a tie is wrong), a detached scalar.
    """
    terms = preference_terms(rewards.reshape(-1).float(), sample_mask, global_valid_seqs, margin=margin)
    correct = terms["accuracy"] * (global_valid_seqs / 2)  # undo the normalization: a count
    return terms["loss"], correct.detach()


def regression_loss(rewards: torch.Tensor, labels: torch.Tensor, sample_mask: torch.Tensor,
                    global_valid_labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean squared error over the attributes that are present (label != -100), as NeMo Aligner's
    regression reward model.

    Args:
        rewards: `[B, K]` predictions.
        labels: `[B, K]` targets, -100.0 where an attribute is missing.
        sample_mask: `[B]`.
        global_valid_labels: scalar, present labels of valid rows over the whole global batch.
    Returns:
        `(loss, squared_error_sum)`; the second is detached, for metrics.
    """
    mask = regression_label_mask(labels, sample_mask).float()
    squared = (rewards.float() - torch.where(mask > 0, labels.float(), torch.zeros_like(mask))).pow(2)
    return masked_mean(squared, mask, global_valid_labels), (squared * mask).sum().detach()


def valid_label_count(labels: torch.Tensor, sample_mask: torch.Tensor) -> torch.Tensor:
    """Present labels `[]` of a `[B, K]` label tensor on valid rows (the regression loss denominator)."""
    return regression_label_mask(labels, sample_mask).float().sum()
