"""GRPO advantages, masked_mean with global normalization, metric reduction, valid counts."""

import math

import pytest
import torch
from loss_data import global_counts, random_batch
from test_nll_dpo import DPO_CFG
from test_packing import PG_CFG

from rmkit.losses import (
    ClippedPGLossFn,
    DPOLossFn,
    NLLLoss,
    PreferenceLoss,
    RegressionLoss,
    SequencePackingLossWrapper,
    grpo_group_advantages,
    masked_mean,
    reduce_metrics,
    regression_label_mask,
    valid_counts,
)


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


def test_reduce_metrics_of_tensors_matches_floats_and_stays_on_the_device():
    rows = [
        {"loss": 0.25, "probs_ratio_min": float("inf"), "probs_ratio_max": 1.1},
        {"loss": 0.5, "probs_ratio_min": 0.9, "probs_ratio_max": float("-inf")},
        {"loss": 0.25, "probs_ratio_min": 0.8, "probs_ratio_max": 1.05},
    ]
    out = reduce_metrics([{k: torch.tensor(v, dtype=torch.float64) for k, v in row.items()} for row in rows])
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in out.values())
    assert {k: v.item() for k, v in out.items()} == reduce_metrics(rows) == {
        "loss": 1.0, "probs_ratio_min": 0.8, "probs_ratio_max": 1.1}


def _every_loss_on_a_batch():
    logits, data = random_batch(batch=4, seq=6, seed=3)
    gvs, gvt = global_counts(data)
    packed = {k: v if v.dim() == 1 else v.reshape(1, 24, *v.shape[2:]) for k, v in data.items()}
    rewards = logits[:, 0, :3]  # [4, 3], requires grad
    labels = torch.tensor([[1.0, -100.0, 0.5]] * 4, dtype=torch.float64)
    regression = {"labels": labels, "sample_mask": data["sample_mask"]}
    packing = SequencePackingLossWrapper(ClippedPGLossFn(PG_CFG), torch.tensor([0, 6, 12, 18, 24]))
    yield NLLLoss()(logits, data, gvs, gvt)
    yield DPOLossFn(DPO_CFG)(logits, data, gvs, gvt)
    yield ClippedPGLossFn(PG_CFG)(logits, data, gvs, gvt)
    yield packing(logits.reshape(1, 24, -1), packed, gvs, gvt)
    yield PreferenceLoss(center_rewards_coefficient=0.1)(rewards[:, 0], data, gvs, None)
    yield RegressionLoss()(rewards, regression, gvs, regression_label_mask(labels, data["sample_mask"]).sum())


def test_every_loss_returns_its_metrics_as_detached_0_dim_tensors():
    # Tensors, so that a training loop is not synchronized with the device once per metric.
    for loss, metrics in _every_loss_on_a_batch():
        assert loss.requires_grad and metrics
        for key, value in metrics.items():
            assert isinstance(value, torch.Tensor) and value.dim() == 0 and not value.requires_grad, key
