"""GRPO advantages, masked_mean with global normalization, metric reduction, valid counts."""

import math

import pytest
import torch

from rmkit.losses import grpo_group_advantages, masked_mean, reduce_metrics, valid_counts


def test_grpo_group_mean_baseline():
    # Groups [1, 2, 3] and [5, 5, 5]: mean 2 -> [-1, 0, 1]; equal rewards -> 0.
    adv = grpo_group_advantages(torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0]), group_size=3)
    torch.testing.assert_close(adv, torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]))


def test_grpo_leave_one_out_and_std():
    rewards = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0], dtype=torch.float64)
    # Leave-one-out (RLOO): 1 - (2+3)/2 = -1.5, 2 - 2 = 0, 3 - 1.5 = 1.5.
    loo = grpo_group_advantages(rewards, 3, leave_one_out=True)
    torch.testing.assert_close(loo, torch.tensor([-1.5, 0.0, 1.5, 0.0, 0.0, 0.0], dtype=torch.float64))
    # std of [1, 2, 3] (unbiased) = 1; the equal group has std 0 and stays 0 (no division by eps).
    norm = grpo_group_advantages(rewards, 3, normalize_std=True, eps=1e-6)
    torch.testing.assert_close(
        norm, torch.tensor([-1 / (1 + 1e-6), 0.0, 1 / (1 + 1e-6), 0, 0, 0], dtype=torch.float64)
    )


def test_grpo_matches_loop_reference():
    rewards = torch.randn(12, dtype=torch.float64)
    got = grpo_group_advantages(rewards, 4, leave_one_out=True, normalize_std=True)
    for g in range(3):
        group = rewards[4 * g : 4 * g + 4].tolist()
        mean = sum(group) / 4
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / 3)
        for j, x in enumerate(group):
            baseline = (sum(group) - x) / 3
            assert got[4 * g + j].item() == pytest.approx((x - baseline) / (std + 1e-6), rel=1e-12)


def test_grpo_errors():
    with pytest.raises(ValueError, match="groups of 4"):
        grpo_group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="group_size >= 2"):
        grpo_group_advantages(torch.zeros(3), 1, leave_one_out=True)


def test_masked_mean_local_global_and_dim():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert masked_mean(values, mask).item() == pytest.approx(1.5)
    assert masked_mean(values, mask, global_normalization_factor=6).item() == pytest.approx(0.5)
    torch.testing.assert_close(masked_mean(values, mask, dim=-1), torch.tensor([1.5, 0.0]))  # empty row: 0
    assert masked_mean(values, torch.zeros_like(mask)).item() == 0.0
    assert masked_mean(values, torch.zeros_like(mask), global_normalization_factor=0).item() == 0.0


def test_valid_counts_skip_position_zero():
    token_mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    seqs, toks = valid_counts(torch.tensor([1.0, 1.0]), token_mask)
    assert seqs.item() == 2 and toks.item() == 3


def test_reduce_metrics_sums_and_min_max_skip_inf():
    out = reduce_metrics(
        [
            {"loss": 0.25, "probs_ratio_min": 0.9, "probs_ratio_max": 1.1},
            {"loss": 0.5, "probs_ratio_min": float("inf"), "probs_ratio_max": float("-inf")},
            {"loss": 0.25, "probs_ratio_min": 0.8, "probs_ratio_max": 1.05},
        ]
    )
    assert out == {"loss": 1.0, "probs_ratio_min": 0.8, "probs_ratio_max": 1.1}
