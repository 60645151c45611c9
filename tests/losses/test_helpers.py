"""masked_mean with global normalization, metric reduction, valid counts."""

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
    masked_mean,
    reduce_metrics,
    regression_label_mask,
    valid_counts,
)


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
