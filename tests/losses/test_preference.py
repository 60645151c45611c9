"""PreferenceLoss and RegressionLoss against loop references and hand-derived values."""

import math

import loss_reference as ref
import pytest
import torch

from rmkit.losses import PreferenceLoss, RegressionLoss, regression_label_mask


def test_equal_rewards_give_ln2_and_zero_accuracy():
    # -logsigmoid(0) = ln 2 for every pair; a tie is not a correct ranking (strict >).
    rewards = torch.tensor([0.7, 0.7, -1.0, -1.0])
    loss, metrics = PreferenceLoss()(rewards, {"sample_mask": torch.ones(4)}, 4, None)
    assert loss.item() == pytest.approx(math.log(2), rel=1e-6)
    assert metrics["accuracy"] == 0.0
    assert metrics["num_valid_samples"] == 2
    assert metrics["rewards_chosen_mean"] == pytest.approx(-0.15, rel=1e-6)


def test_hand_derived_pair_with_beta_and_margin():
    # r_c - r_r = 2, beta 0.5 -> z = 1, margin 0.25 -> z = 0.75: loss = log(1 + e^-0.75).
    rewards = torch.tensor([[3.0], [1.0]])
    data = {"sample_mask": torch.ones(2), "margin": torch.tensor([0.25])}
    loss, metrics = PreferenceLoss(beta=0.5)(rewards, data, 2, None)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.75)), rel=1e-6)
    assert metrics["accuracy"] == 1.0


@pytest.mark.parametrize("beta,margin,center", [(1.0, False, None), (0.3, True, 0.01), (2.0, False, 0.5)])
def test_matches_loop_reference_values_and_gradients(beta, margin, center):
    rewards = torch.randn(10, dtype=torch.float64, requires_grad=True)
    sample_mask = torch.tensor([1, 1, 0, 0, 1, 1, 1, 1, 1, 1], dtype=torch.float64)
    data = {"sample_mask": sample_mask}
    if margin:
        data["margin"] = torch.rand(5, dtype=torch.float64)
    loss, _ = PreferenceLoss(beta, center)(rewards, data, 8.0, None)
    want = ref.preference(rewards, sample_mask, 8.0, beta, data.get("margin"), center)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=0)
    (g,) = torch.autograd.grad(loss, rewards)
    (g_want,) = torch.autograd.grad(want, rewards)
    torch.testing.assert_close(g, g_want, rtol=1e-12, atol=1e-15)
    assert torch.all(g[2:4] == 0)  # the masked pair gets no gradient


def test_bad_reward_shape_is_a_clear_error():
    with pytest.raises(ValueError, match=r"\[2N\] or \[2N, 1\]"):
        PreferenceLoss()(torch.randn(4, 2), {"sample_mask": torch.ones(4)}, 4, None)
    with pytest.raises(ValueError, match="even number"):
        PreferenceLoss()(torch.randn(3), {"sample_mask": torch.ones(3)}, 3, None)
    with pytest.raises(ValueError, match="center_rewards_coefficient"):
        PreferenceLoss(center_rewards_coefficient=-1)


def test_regression_matches_loop_reference_and_skips_minus_100():
    rewards = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    labels = torch.randn(5, 3, dtype=torch.float64)
    labels[0, 1] = labels[3, 0] = labels[3, 2] = -100
    sample_mask = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0])
    gvt = regression_label_mask(labels, sample_mask).sum()
    assert gvt.item() == 15 - 3 - 3  # three -100 entries, one masked row
    loss, metrics = RegressionLoss()(rewards, {"labels": labels, "sample_mask": sample_mask}, 4, gvt)
    want = ref.regression(rewards, labels, sample_mask, gvt)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=0)
    (g,) = torch.autograd.grad(loss, rewards)
    (g_want,) = torch.autograd.grad(want, rewards)
    torch.testing.assert_close(g, g_want, rtol=1e-12, atol=1e-15)
    assert g[0, 1] == 0 and torch.all(g[2] == 0)
    assert metrics["num_valid_labels"] == 9 and metrics["num_valid_samples"] == 4


def test_regression_hand_value():
    # (1 - 0)^2 and (3 - 1)^2 over 2 valid entries: (1 + 4) / 2.
    loss, _ = RegressionLoss()(
        torch.tensor([1.0, 3.0, 9.0]), {"labels": torch.tensor([0.0, 1.0, -100.0])}, 3, 2
    )
    assert loss.item() == pytest.approx(2.5)
