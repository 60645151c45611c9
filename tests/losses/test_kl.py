"""calculate_kl: NeMo RL's unit tests re-created (same inputs and expected values), plus gradients.

Tolerances: float32 inputs as in NeMo RL; rtol 1e-3 against the 4-digit expected values, and
torch's float32 defaults (rtol 1.3e-6, atol 1e-5) where NeMo RL uses them.
"""

import math

import pytest
import torch

from rmkit.losses import calculate_kl

LOGPROBS = torch.tensor([[-1.0, -1.0, -1.0]])
REFERENCE = torch.tensor([[-0.0, -15.0, -30.0]])  # log-ratios ref - curr: 1, -14, -29


@pytest.mark.parametrize(
    "kl_type,unclamped,clamped",
    [
        # k1 = curr - ref; clamped: the input to [-20, 20] (-29 -> -20), then the output to [-10, 10].
        ("k1", [-1.0, 14.0, 29.0], [-1.0, 10.0, 10.0]),
        # k2 = log_ratio^2 / 2: 1/2, 196/2, 841/2.
        ("k2", [0.5, 98.0, 420.5], [0.5, 10.0, 10.0]),
        # k3 = e^r - 1 - r: e - 2, e^-14 + 13, e^-29 + 28.
        ("k3", [0.7183, 13.0, 28.0], [0.7183, 10.0, 10.0]),
    ],
)
def test_nemo_calculate_kl(kl_type, unclamped, clamped):
    # NeMo RL: test_calculate_kl.
    kl = calculate_kl(LOGPROBS, REFERENCE, kl_type, input_clamp_value=None, output_clamp_value=None)
    assert torch.allclose(kl, torch.tensor([unclamped]), rtol=1e-3)
    kl = calculate_kl(LOGPROBS, REFERENCE, kl_type, input_clamp_value=20.0, output_clamp_value=10.0)
    assert torch.allclose(kl, torch.tensor([clamped]), rtol=1e-3)


def test_nemo_input_clamp_detaches_the_importance_weight():
    # NeMo RL: test_calculate_kl_detaches_importance_sampling_when_input_clamped.
    # Log-ratios 3 and 1 with bound 2: the first is clamped (k3 = e^2 - 3 = 4.389), and its weight
    # exp(x - x.detach()) loses its gradient with it; the second keeps d/dx[w * k3] = k3 + (1 - e^1)
    # = (e - 2) + 1 - e = -1.
    logprobs = torch.tensor([[-3.0, -1.0]], requires_grad=True)
    weights = torch.exp(logprobs - logprobs.detach())
    kl = calculate_kl(logprobs, torch.zeros(1, 2), "k3", input_clamp_value=2.0, output_clamp_value=None,
                      importance_weights=weights)
    torch.testing.assert_close(kl.detach(), torch.tensor([[4.389056, 0.7182818]]))
    kl.sum().backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, -1.0]]), atol=1e-6, rtol=1e-6)


def test_nemo_output_clamp_applies_after_the_importance_weight():
    # NeMo RL: test_calculate_kl_output_clamp_includes_importance_sampling_weight.
    # 100 * (e - 2) = 71.8 is clamped to 1, so nothing flows back, through the weight or the estimate.
    logprobs = torch.tensor([[-1.0]], requires_grad=True)
    weights = 100.0 * torch.exp(logprobs - logprobs.detach())
    kl = calculate_kl(logprobs, torch.zeros(1, 1), "k3", input_clamp_value=None, output_clamp_value=1.0,
                      importance_weights=weights)
    torch.testing.assert_close(kl.detach(), torch.tensor([[1.0]]))
    kl.sum().backward()
    torch.testing.assert_close(logprobs.grad, torch.zeros(1, 1), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    "kl_type,value,grad",
    [
        # r = ref - x = log 2 at x = log(1/2), ref = 0; d r / d x = -1.
        ("k1", -math.log(2), 1.0),  # -r; d/dx = 1
        ("k2", math.log(2) ** 2 / 2, -math.log(2)),  # r^2 / 2; d/dx = -r
        ("k3", 1 - math.log(2), 1 - 2.0),  # e^r - 1 - r; d/dx = 1 - e^r
    ],
)
def test_estimators_hand_values_and_gradients(kl_type, value, grad):
    # float64; 1e-12 relative. No weight: the gradient is the estimator's own.
    x = torch.tensor([math.log(0.5)], dtype=torch.float64, requires_grad=True)
    kl = calculate_kl(x, torch.zeros(1, dtype=torch.float64), kl_type)
    kl.sum().backward()
    assert kl.item() == pytest.approx(value, rel=1e-12)
    assert x.grad.item() == pytest.approx(grad, rel=1e-12)


def test_weight_at_the_clamp_boundary_keeps_its_gradient():
    # |r| == bound is not changed by the clamp: weight and estimate both keep their gradients.
    x = torch.tensor([-2.0], dtype=torch.float64, requires_grad=True)
    w = torch.exp(x - x.detach())
    kl = calculate_kl(x, torch.zeros(1, dtype=torch.float64), "k1", input_clamp_value=2.0,
                      output_clamp_value=None, importance_weights=w)
    kl.sum().backward()
    assert x.grad.item() == pytest.approx(-2.0 + 1.0, rel=1e-12)  # d/dx[w * x] = x + 1 at w = 1


def test_unknown_kl_type_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown KL type 'k4'"):
        calculate_kl(LOGPROBS, REFERENCE, "k4")
