"""GRPO / RLOO group advantages: NeMo RL's unit-test cases, hand-worked cases, a slow loop reference.

NeMo RL's tests (tests/unit/algorithms/test_utils.py `calculate_baseline_and_std_per_prompt_*`,
tests/unit/algorithms/test_grpo.py `grpo_advantage_estimator_*`) identify a group by identical prompt
token rows; here each distinct prompt row becomes one `group_index` value, the rest is unchanged.
"""

import math
import statistics

import pytest
import torch

from rmkit.losses import consecutive_groups, group_baseline_and_std, grpo_group_advantages

TWO_PROMPTS = torch.tensor([0, 0, 0, 1, 1, 1])
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _close(got, expected, rtol=1e-5):
    torch.testing.assert_close(got, torch.tensor(expected, dtype=got.dtype), rtol=rtol, atol=1e-8)


# --- NeMo RL: calculate_baseline_and_std_per_prompt (leave-one-out, its default) ---------------


def test_nemo_basic():
    baseline, std = group_baseline_and_std(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), TWO_PROMPTS)
    _close(baseline, [2.5, 2.0, 1.5, 5.5, 5.0, 4.5])
    _close(std, [0.707107, 1.414214, 0.707107, 0.707107, 1.414214, 0.707107])


def test_nemo_single_generation_per_prompt():
    baseline, std = group_baseline_and_std(torch.tensor([2.5, 4.0]), torch.tensor([0, 1]))
    _close(baseline, [2.5, 4.0])  # baseline = reward: advantage 0
    _close(std, [0.0, 0.0])


def test_nemo_identical_rewards():
    baseline, std = group_baseline_and_std(torch.tensor([3.0, 3.0, 3.0, 7.0, 7.0, 7.0]), TWO_PROMPTS)
    _close(baseline, [3.0, 3.0, 3.0, 7.0, 7.0, 7.0])
    assert torch.equal(std, torch.zeros(6))


def test_nemo_mixed_prompt_sizes():
    baseline, std = group_baseline_and_std(torch.tensor([1.0, 2.0, 4.0, 5.0, 6.0]), torch.tensor([0, 0, 1, 1, 1]))
    _close(baseline, [2.0, 1.0, 5.5, 5.0, 4.5])
    _close(std, [0.0, 0.0, 0.707107, 1.414214, 0.707107])


def test_nemo_empty_input():
    baseline, std = group_baseline_and_std(torch.tensor([]), torch.empty(0, dtype=torch.long))
    assert baseline.shape == std.shape == (0,)


def test_nemo_valid_mask_excludes_a_sample():
    # Row 1 (reward 999) is masked out: rows 0 and 2 see only each other. Row 1's own baseline is
    # NeMo RL's formula applied as is: (1 + 3) / (2 valid - 1) = 4.
    rewards = torch.tensor([1.0, 999.0, 3.0, 4.0, 5.0, 6.0])
    valid = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    baseline, std = group_baseline_and_std(rewards, TWO_PROMPTS, valid)
    _close(baseline, [3.0, 4.0, 1.0, 5.5, 5.0, 4.5])
    _close(std, [0.0, 0.0, 0.0, 0.707107, 1.414214, 0.707107])


@pytest.mark.parametrize("device", DEVICES)
def test_nemo_device_compatibility(device):
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0], device=device)
    baseline, std = group_baseline_and_std(rewards, torch.tensor([0, 0, 1, 1], device=device))
    assert baseline.device.type == std.device.type == device
    _close(baseline.cpu(), [2.0, 1.0, 4.0, 3.0])
    _close(std.cpu(), [0.0, 0.0, 0.0, 0.0])


def test_nemo_numerical_precision():
    rewards = torch.tensor([1e-8, 2e-8, 3e-8, 1e8, 2e8, 3e8])
    baseline, std = group_baseline_and_std(rewards, TWO_PROMPTS)
    _close(baseline, [2.5e-8, 2e-8, 1.5e-8, 2.5e8, 2e8, 1.5e8])
    assert torch.isfinite(std).all()
    # two-pass float64: the std is exact too (NeMo RL only asks for finite)
    _close(std, [0.707107e-8, 1.414214e-8, 0.707107e-8, 0.707107e8, 1.414214e8, 0.707107e8])


# --- NeMo RL: GRPOAdvantageEstimator with use_leave_one_out_baseline=False, normalize_rewards=True -


def _grpo_whole_group(rewards, group_index):
    return grpo_group_advantages(torch.tensor(rewards), torch.tensor(group_index), use_leave_one_out_baseline=False)


def test_nemo_estimator_zero_std():
    adv = _grpo_whole_group([2.0, 2.0, 1.0, 3.0], [0, 0, 1, 1])
    # prompt 0: std 0 -> not divided, advantage 0; prompt 1: std sqrt(2) -> -+1/sqrt(2)
    assert torch.equal(adv[:2], torch.zeros(2))
    _close(adv[2:], [-(2**-0.5), 2**-0.5], rtol=1e-4)


def test_nemo_estimator_tensor_shapes():
    _close(_grpo_whole_group([1.0, 3.0], [0, 0]), [-(2**-0.5), 2**-0.5], rtol=1e-4)
    adv = grpo_group_advantages(torch.arange(10, dtype=torch.float32), torch.zeros(10, dtype=torch.long),
                                use_leave_one_out_baseline=False)
    assert adv.shape == (10,)
    assert adv.mean().abs() < 1e-5


def test_nemo_estimator_negative_advantages():
    adv = _grpo_whole_group([0.0, 2.0, 4.0], [0, 0, 0])
    assert adv[0] < 0 < adv[2]
    assert adv[1].abs() < 1e-5
    torch.testing.assert_close(adv[0], -adv[2], rtol=1e-5, atol=0)


def test_nemo_estimator_zero_std_and_zero_advantage():
    assert torch.equal(_grpo_whole_group([5.0, 5.0, 5.0, 5.0], [0, 0, 0, 0]), torch.zeros(4))


def test_nemo_estimator_small_nonzero_std():
    adv = _grpo_whole_group([1.0, 1.01], [0, 0])  # a small std is still divided by
    _close(adv.abs(), [2**-0.5, 2**-0.5], rtol=1e-3)
    assert adv[0] * adv[1] < 0


# --- hand-worked cases ----------------------------------------------------------------------------


def test_group_of_one_gets_zero_advantage():
    for loo in (True, False):
        adv = grpo_group_advantages(torch.tensor([7.0]), group_size=1, use_leave_one_out_baseline=loo)
        assert torch.equal(adv, torch.zeros(1))


def test_group_of_two_with_leave_one_out_is_not_normalized():
    # baselines are the other reward: 1 - 4 = -3, 4 - 1 = 3; the other response's std is 0.
    adv = grpo_group_advantages(torch.tensor([1.0, 4.0]), group_size=2)
    assert torch.equal(adv, torch.tensor([-3.0, 3.0]))


def test_leave_one_out_divides_by_the_others_std():
    # [1, 2, 3, 6]: row 3 sees [1, 2, 3] (mean 2, unbiased std 1): (6 - 2) / (1 + 1e-6).
    # row 0 sees [2, 3, 6]: mean 11/3, std sqrt(((2-11/3)^2 + (3-11/3)^2 + (6-11/3)^2) / 2) = sqrt(13/3).
    adv = grpo_group_advantages(torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=torch.float64), group_size=4)
    assert adv[3].item() == pytest.approx(4 / (1 + 1e-6), rel=1e-12)
    assert adv[0].item() == pytest.approx((1 - 11 / 3) / (math.sqrt(13 / 3) + 1e-6), rel=1e-12)


def test_others_all_equal_means_std_exactly_zero():
    # row 3's others are three 0.1s: their std is 0, so 0.7 - 0.1 is not divided by ~1e-6.
    adv = grpo_group_advantages(torch.tensor([0.1, 0.1, 0.1, 0.7], dtype=torch.float64), group_size=4)
    assert adv[3].item() == pytest.approx(0.6, rel=1e-12)


def test_whole_group_baseline_without_normalization():
    adv = grpo_group_advantages(torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0]), group_size=3,
                                use_leave_one_out_baseline=False, normalize_rewards=False)
    assert torch.equal(adv, torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]))


def _loop_reference(rewards, groups, loo, normalize, eps=1e-6):
    out = []
    for j, (r, g) in enumerate(zip(rewards, groups)):
        group = [rewards[i] for i in range(len(rewards)) if groups[i] == g]
        pool = [rewards[i] for i in range(len(rewards)) if groups[i] == g and (i != j or not loo)]
        if len(group) == 1:
            out.append(0.0)
            continue
        adv = r - statistics.fmean(pool)
        std = statistics.stdev(pool) if len(pool) > 1 else 0.0
        out.append(adv / (std + eps) if normalize and std > 0 else adv)
    return out


@pytest.mark.parametrize("loo", [True, False])
@pytest.mark.parametrize("normalize", [True, False])
def test_mixed_group_sizes_match_a_loop(loo, normalize):
    g = torch.Generator().manual_seed(3)
    sizes = [1, 2, 3, 5, 8, 4]
    groups = torch.cat([torch.full((s,), 10 * k + 7) for k, s in enumerate(sizes)])
    groups = groups[torch.randperm(len(groups), generator=g)]  # interleaved, not consecutive
    rewards = torch.randn(len(groups), generator=g, dtype=torch.float64)
    got = grpo_group_advantages(rewards, groups, use_leave_one_out_baseline=loo, normalize_rewards=normalize)
    expected = _loop_reference(rewards.tolist(), groups.tolist(), loo, normalize)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_group_size_is_consecutive_group_index():
    rewards = torch.randn(12)
    torch.testing.assert_close(grpo_group_advantages(rewards, group_size=4),
                               grpo_group_advantages(rewards, consecutive_groups(12, 4)), rtol=0, atol=0)
    assert consecutive_groups(6, 3).tolist() == [0, 0, 0, 1, 1, 1]


def test_same_prompt_sampled_twice_stays_two_groups():
    # Two groups with identical prompts but different indices keep their own baselines.
    adv = grpo_group_advantages(torch.tensor([0.0, 1.0, 10.0, 11.0]), torch.tensor([0, 0, 1, 1]),
                                normalize_rewards=False, use_leave_one_out_baseline=False)
    assert torch.equal(adv, torch.tensor([-0.5, 0.5, -0.5, 0.5]))


def test_errors():
    with pytest.raises(ValueError, match="groups of 4"):
        grpo_group_advantages(torch.zeros(6), group_size=4)
    with pytest.raises(ValueError, match="exactly one"):
        grpo_group_advantages(torch.zeros(4), torch.zeros(4, dtype=torch.long), group_size=2)
    with pytest.raises(ValueError, match="exactly one"):
        grpo_group_advantages(torch.zeros(4))
    with pytest.raises(ValueError, match="integer tensor of shape"):
        grpo_group_advantages(torch.zeros(4), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="integer tensor of shape"):
        grpo_group_advantages(torch.zeros(4), torch.zeros(4))
    with pytest.raises(TypeError, match="group_size=k"):  # the old positional group_size
        grpo_group_advantages(torch.zeros(4), 2)
