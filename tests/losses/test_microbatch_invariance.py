"""Gradient accumulation is exact: 1, 2 and 4 microbatches give the full batch's loss and gradients.

A tiny float64 "model" (embedding + linear head) produces the logits, so the check is on parameter
gradients accumulated over backward calls, as a training loop does. Tolerance 1e-6 relative
(float64 makes the actual differences ~1e-15).
"""

import pytest
import torch
from loss_data import global_counts, random_batch, split_batch

from rmkit.losses import (
    ClippedPGLossFn,
    DPOLossFn,
    NLLLoss,
    PreferenceLoss,
    RegressionLoss,
    regression_label_mask,
)

VOCAB = 11


def _model():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, 8), torch.nn.Linear(8, VOCAB)).double()


def _run(model, loss_fn, data, splits, counts, head=None):
    """Sum of microbatch losses and the accumulated parameter gradients."""
    model.zero_grad()
    rows = data["sample_mask"].shape[0]
    step = rows // splits
    total = 0.0
    for i in range(splits):
        micro = split_batch(data, slice(i * step, (i + 1) * step))
        out = model(micro["input_ids"])
        out = head(out) if head is not None else out
        loss, _ = loss_fn(out, micro, *counts)
        loss.backward()
        total += loss.item()
    return total, [p.grad.clone() for p in model.parameters()]


def _assert_invariant(model, loss_fn, data, counts, head=None):
    full_loss, full_grads = _run(model, loss_fn, data, 1, counts, head)
    for splits in (2, 4):
        loss, grads = _run(model, loss_fn, data, splits, counts, head)
        assert loss == pytest.approx(full_loss, rel=1e-6)
        for g, g_full in zip(grads, full_grads):
            torch.testing.assert_close(g, g_full, rtol=1e-6, atol=1e-12)
    assert any(g.abs().sum() > 0 for g in full_grads)  # the check is not vacuous


def _policy_data(batch=8):
    _, data = random_batch(batch=batch, seq=6, vocab=VOCAB, seed=5)
    data["sample_mask"][5] = 0
    return data


@pytest.mark.parametrize("token_level", [True, False])
def test_clipped_pg(token_level):
    cfg = {
        "reference_policy_kl_penalty": 0.1,
        "ratio_clip_min": 0.2,
        "ratio_clip_max": 0.2,
        "ratio_clip_c": 3.0,
        "use_on_policy_kl_approximation": True,
        "use_importance_sampling_correction": True,
        "token_level_loss": token_level,
    }
    data = _policy_data()
    _assert_invariant(_model(), ClippedPGLossFn(cfg), data, global_counts(data))


def test_nll():
    data = _policy_data()
    _assert_invariant(_model(), NLLLoss(), data, global_counts(data))


def test_dpo():
    cfg = {
        "reference_policy_kl_penalty": 0.2,
        "preference_loss_weight": 1.0,
        "sft_loss_weight": 0.3,
        "preference_average_log_probs": False,
        "sft_average_log_probs": True,
    }
    data = _policy_data()
    data["sample_mask"][4] = 0  # pair (4, 5) is out
    _assert_invariant(_model(), DPOLossFn(cfg), data, (data["sample_mask"].sum(), None))


def test_preference_with_margin_and_centering():
    data = _policy_data()
    data["sample_mask"][4] = 0
    data["margin"] = torch.rand(8, dtype=torch.float64)  # 8 pairs-worth; sliced with the rows below

    def head(out):  # reward = mean of the last position's logits: [2N]
        return out[:, -1].mean(-1)

    loss_fn = PreferenceLoss(beta=0.7, center_rewards_coefficient=0.05)

    def with_pair_margin(rewards, micro, gvs, gvt):
        micro = {**micro, "margin": micro["margin"][0::2]}
        return loss_fn(rewards, micro, gvs, gvt)

    _assert_invariant(_model(), with_pair_margin, data, (data["sample_mask"].sum(), None), head)


def test_regression():
    data = _policy_data()
    data["labels"] = torch.randn(8, 3, dtype=torch.float64)
    data["labels"][2, 1] = data["labels"][6, 0] = -100

    def head(out):
        return out[:, -1, :3]

    gvt = regression_label_mask(data["labels"], data["sample_mask"]).sum()
    _assert_invariant(_model(), RegressionLoss(), data, (data["sample_mask"].sum(), gvt), head)
