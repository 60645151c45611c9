"""On-policy distillation (MOPD) advantages and metrics: NeMo RL's tests, a loop reference, bad input.

NeMo RL's cases come from tests/unit/algorithms/test_advantage_estimator.py (`test_opd_*`), inputs and
expected values unchanged; NeMo RL's `compute_advantage(prompt_ids, rewards, mask, teacher_logprobs=,
prev_logprobs=)` became `opd_advantages(teacher_logprobs, prev_logprobs, mask)` (prompt ids and rewards are
unused there) and its `last_metrics` became `opd_metrics(...)`.
"""

import math
import statistics

import pytest
import torch

from rmkit.losses import opd_advantages, opd_metrics, response_mask

GAP = "on_policy_distillation/teacher_student_logprob_gap_mean"
ADV_MEAN = "on_policy_distillation/adv_mean"
ADV_STD = "on_policy_distillation/adv_std"

# --- NeMo RL's tests ----------------------------------------------------------------------------


def test_nemo_opd_basic_positive_distill_advantage():
    # test_opd_basic_positive_distill_advantage: teacher_lp > student_lp => positive advantages
    teacher_lp, student_lp = torch.zeros(2, 4), torch.full((2, 4), -1.0)
    adv = opd_advantages(teacher_lp, student_lp, torch.ones(2, 4))
    assert adv.shape == (2, 4)
    assert (adv > 0).all()
    assert torch.equal(adv, torch.ones(2, 4))  # exactly 0 - (-1)


def test_nemo_opd_teacher_equals_student():
    # test_opd_teacher_equals_student: same log-probs => zero advantages (NeMo RL draws them unseeded)
    logprobs = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    adv = opd_advantages(logprobs, logprobs, torch.ones(2, 4))
    torch.testing.assert_close(adv, torch.zeros(2, 4))


def test_nemo_opd_mask_applied():
    # test_opd_mask_applied: masked tokens have zero advantage, the others stay positive
    mask = torch.tensor([[1, 1, 1, 0, 0, 0]], dtype=torch.float32)
    adv = opd_advantages(torch.zeros(1, 6), torch.full((1, 6), -1.0), mask)
    assert (adv[:, 3:] == 0).all()
    assert (adv[:, :3] > 0).all()


def test_nemo_opd_metrics_returned():
    # test_opd_metrics_returned: teacher - student = 0 - (-1) = 1 everywhere; NeMo RL's tolerance 1e-5
    metrics = opd_metrics(torch.zeros(2, 4), torch.full((2, 4), -1.0), torch.ones(2, 4))
    assert set(metrics) == {GAP, ADV_MEAN, ADV_STD}
    assert abs(metrics[GAP].item() - 1.0) < 1e-5
    assert abs(metrics[ADV_MEAN].item() - 1.0) < 1e-5
    assert abs(metrics[ADV_STD].item()) < 1e-5


# --- against a loop -----------------------------------------------------------------------------


def reference_opd(teacher, prev, token_mask, sample_mask):
    """Python floats: the advantage table and the three metrics, from token_mask / sample_mask directly
    (position 0 never trains: it has no log-prob)."""
    rows, cols = token_mask.shape
    adv, valid = [[0.0] * cols for _ in range(rows)], []
    for b in range(rows):
        for t in range(1, cols):
            if token_mask[b, t] and sample_mask[b]:
                adv[b][t] = float(teacher[b, t]) - float(prev[b, t])
                valid.append(adv[b][t])
    mean = sum(valid) / len(valid) if valid else 0.0
    std = statistics.stdev(valid) if len(valid) > 1 else 0.0
    return adv, {GAP: mean, ADV_MEAN: mean, ADV_STD: std}


def _random_rollout(seed, dtype=torch.float64):
    """6 rows of 9 tokens: a prompt, responses of different lengths, padding, a row with no trained token and
    a row left out by sample_mask; the teacher's log-probs outside the trained tokens are not finite."""
    g = torch.Generator().manual_seed(seed)
    teacher = -5 * torch.rand(6, 9, generator=g, dtype=torch.float64)
    prev = -5 * torch.rand(6, 9, generator=g, dtype=torch.float64)
    teacher[:, 0] = prev[:, 0] = 0.0  # position 0 holds 0 (docs/design.md)
    token_mask = torch.zeros(6, 9, dtype=torch.float64)
    for b, (start, end) in enumerate([(2, 9), (3, 6), (1, 4), (4, 8), (0, 0), (2, 7)]):
        token_mask[b, start:end] = 1.0  # row 4: no trained token
    token_mask[2, 0] = 1.0  # position 0 marked: response_mask drops it
    sample_mask = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0], dtype=torch.float64)  # row 5 left out
    teacher[token_mask == 0] = -math.inf
    teacher[1, 7] = math.nan
    teacher[5] = math.nan
    return teacher.to(dtype), prev.to(dtype), token_mask, sample_mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_opd_matches_a_loop(seed):
    teacher, prev, token_mask, sample_mask = _random_rollout(seed)
    mask = response_mask(token_mask, sample_mask)
    expected, expected_metrics = reference_opd(teacher, prev, token_mask, sample_mask)
    adv = opd_advantages(teacher, prev, mask)
    assert adv.dtype == torch.float64 and torch.isfinite(adv).all()
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=0)
    metrics = opd_metrics(teacher, prev, mask)
    for name, value in expected_metrics.items():
        assert metrics[name].item() == pytest.approx(value, rel=1e-12, abs=1e-12), name  # summation order only


def test_opd_float32_and_bfloat16_inputs():
    teacher, prev, token_mask, sample_mask = _random_rollout(3)
    mask = response_mask(token_mask, sample_mask).float()
    expected = opd_advantages(teacher, prev, mask)
    # float32 inputs: one rounding of each log-prob, then a float32 difference
    got = opd_advantages(teacher.float(), prev.float(), mask)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=1e-5)
    # bfloat16 log-probs are widened to float32 before the difference: exact on the rounded inputs
    t16, p16 = teacher.bfloat16(), prev.bfloat16()
    got = opd_advantages(t16, p16, mask)
    assert got.dtype == torch.float32
    assert torch.equal(got, opd_advantages(t16.float(), p16.float(), mask))


def test_opd_metrics_with_too_few_tokens():
    teacher, prev = torch.tensor([[0.0, -1.0, -2.0]]), torch.tensor([[0.0, -3.0, -1.0]])
    none = opd_metrics(teacher, prev, torch.zeros(1, 3))
    assert all(v.item() == 0.0 for v in none.values())
    one = opd_metrics(teacher, prev, torch.tensor([[0.0, 1.0, 0.0]]))
    assert (one[GAP].item(), one[ADV_MEAN].item(), one[ADV_STD].item()) == (2.0, 2.0, 0.0)
    # gaps 2 and -1: mean 0.5, unbiased std sqrt(((1.5)^2 + (1.5)^2) / 1) = 1.5 * sqrt(2)
    two = opd_metrics(teacher, prev, torch.tensor([[0.0, 1.0, 1.0]]))
    assert two[ADV_STD].item() == pytest.approx(1.5 * math.sqrt(2), rel=1e-6)


def test_opd_bool_mask_and_no_gradient():
    teacher = torch.tensor([[0.0, -0.5, -2.0]], requires_grad=True)
    prev = torch.tensor([[0.0, -1.0, -1.0]], requires_grad=True)
    adv = opd_advantages(teacher, prev, torch.tensor([[False, True, True]]))
    assert not adv.requires_grad  # sg[.]: the advantage is a constant of the policy gradient
    assert adv.tolist() == [[0.0, 0.5, -1.0]]
    metrics = opd_metrics(teacher, prev, torch.tensor([[0, 1, 1]]))
    assert not any(v.requires_grad for v in metrics.values())


# --- bad input ----------------------------------------------------------------------------------


def test_opd_refuses_missing_logprobs():
    x, mask = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="OPD requires teacher_logprobs"):
        opd_advantages(None, x, mask)
    with pytest.raises(ValueError, match="OPD requires prev_logprobs"):
        opd_metrics(x, None, mask)


@pytest.mark.parametrize("teacher_shape, prev_shape, mask_shape", [
    ((2, 3), (2, 4), (2, 4)),  # a shorter teacher (NeMo RL pads it in its loop)
    ((2, 4), (2, 4), (2, 3)),
    ((8,), (8,), (8,)),  # per-sequence, not per-token
])
def test_opd_refuses_mismatched_shapes(teacher_shape, prev_shape, mask_shape):
    with pytest.raises(ValueError, match=r"must all be \[B, S\]"):
        opd_advantages(torch.zeros(teacher_shape), torch.zeros(prev_shape), torch.ones(mask_shape))


def test_opd_refuses_integer_logprobs():
    with pytest.raises(ValueError, match="teacher_logprobs must be floating point"):
        opd_advantages(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3), torch.ones(2, 3))
