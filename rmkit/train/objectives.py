"""What the loop minimizes, per reward-model type, with DESIGN.md's global-count normalization.

Each objective maps a micro-batch's rewards and collated tensors to a loss that is already divided by
the *global* count, so summing the micro-batch losses of one optimizer step gives the full-batch loss
(micro-batch 1 x accumulation 8 == micro-batch 8 x accumulation 1), and an all-reduce of the counts
across ranks is the only change data parallelism needs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bradley_terry_loss(rewards: torch.Tensor, margin: torch.Tensor, sample_mask: torch.Tensor,
                       global_valid_seqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairwise loss `-log sigmoid(r_c - r_r - margin)` (InstructGPT eq. 1; margin as in Llama 2).

    Args:
        rewards: `[2N]` or `[2N, 1]` interleaved `[c0, r0, c1, r1, ...]`.
        margin: `[N]` required reward gap (0 where absent).
        sample_mask: `[2N]`; a pair counts when its chosen row counts.
        global_valid_seqs: scalar, valid rows of the whole global batch (2 x pairs).
    Returns:
        `(loss, correct)`: the loss summed over valid pairs / (global_valid_seqs / 2), and `[N]` float
        1.0 where `r_c > r_r` strictly (a tie is wrong) on a valid pair.
    """
    rewards = rewards.reshape(-1).float()
    chosen, rejected = rewards[0::2], rewards[1::2]
    pair_mask = sample_mask[0::2].float()
    per_pair = -F.logsigmoid(chosen - rejected - margin.float())
    loss = (per_pair * pair_mask).sum() / (global_valid_seqs / 2)
    correct = (chosen > rejected).float() * pair_mask
    return loss, correct.detach()


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
    present = (labels != -100.0).float() * sample_mask.float()[:, None]
    squared = (rewards.float() - labels.float()).pow(2) * present
    return squared.sum() / global_valid_labels, squared.sum().detach()


def valid_label_count(labels: torch.Tensor, sample_mask: torch.Tensor) -> torch.Tensor:
    """Present labels `[]` of a `[B, K]` label tensor on valid rows (the regression loss denominator)."""
    return ((labels != -100.0).float() * sample_mask.float()[:, None]).sum()
