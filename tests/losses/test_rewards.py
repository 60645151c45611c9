"""Reward scaling and shaping (`rmkit.losses.rewards`) on NeMo RL's own cases
(`tests/unit/algorithms/test_reward_functions.py`), and the recipes' use of them (`shaped_rewards`)."""

from types import SimpleNamespace

import pytest
import torch

from rmkit.losses.rewards import missing_eos_penalty, overlong_penalty, scale_rewards, stop_properly_penalty
from rmkit.recipes.configs import GRPOLoopConfig, RewardScalingConfig, RewardShapingConfig
from rmkit.rl.rollout import shaped_rewards


@pytest.mark.parametrize("rewards, source, target, expected", [
    # test_reward_scaling_base
    ([1.0, 0.5, 0.8], (0.0, 1.0), (0.0, 0.7), [0.7, 0.35, 0.56]),
    # test_reward_scaling_dapo
    ([1.0, 0.0, 0.0, 1.0, 0.0], (0.0, 1.0), (-1.0, 1.0), [1.0, -1.0, -1.0, 1.0, -1.0]),
    # test_reward_scaling_clipping
    ([-2.8, -0.25, 1.5, 0.5, 2.0, 2.5], (-2.0, 2.0), (-1.0, 1.0), [-1.0, -0.125, 0.75, 0.25, 1.0, 1.0]),
])
def test_scaling_matches_nemo_rl(rewards, source, target, expected):
    out = scale_rewards(torch.tensor(rewards), *source, *target)
    torch.testing.assert_close(out, torch.tensor(expected))


def test_overlong_penalty_matches_nemo_rl():
    # test_reward_shaping_with_penalties: max_response_length 25, buffer 5 (expected length 20), penalty 0.5
    out = overlong_penalty(torch.tensor([1.0, 0.8, 0.6, 0.4]), torch.tensor([10, 22, 25, 30]), 5, 0.5, 25)
    torch.testing.assert_close(out, torch.tensor([1.0, 0.6, 0.1, -0.6]))
    # test_reward_shaping_no_penalties: every completion within the expected length
    rewards = torch.tensor([1.0, 0.5, 0.8])
    assert torch.equal(overlong_penalty(rewards, torch.tensor([10, 15, 18]), 5, 1.0, 25), rewards)


def test_stop_properly_penalty_matches_nemo_rl():
    truncated = torch.tensor([False, True, False, True])  # test_stop_properly_penalty
    out = stop_properly_penalty(torch.tensor([1.0, 0.8, 0.6, 0.4]), truncated, 0.5)
    torch.testing.assert_close(out, torch.tensor([1.0, 0.4, 0.6, 0.2]))
    both = torch.tensor([True, True])  # test_stop_properly_penalty_boundary_coefs
    assert torch.equal(stop_properly_penalty(torch.tensor([1.0, 0.5]), both, 0.0), torch.zeros(2))
    assert torch.equal(stop_properly_penalty(torch.tensor([1.0, 0.5]), both, 1.0), torch.tensor([1.0, 0.5]))


def test_missing_eos_penalty_is_subtracted_whatever_the_sign():
    """TRL's `scores[~contain_eos_token] -= missing_eos_penalty`: a truncated completion loses the penalty, a
    negative reward included (where `stop_properly_penalty`'s share would raise it)."""
    rewards, truncated = torch.tensor([-1.5, 0.5, 2.0, -0.25]), torch.tensor([True, True, False, False])
    torch.testing.assert_close(missing_eos_penalty(rewards, truncated, 1.0), torch.tensor([-2.5, -0.5, 2.0, -0.25]))
    assert torch.equal(missing_eos_penalty(rewards, truncated, 0.0), rewards)
    assert stop_properly_penalty(rewards, truncated, 0.5)[0] > rewards[0]  # why the subtractive form exists


def _rollout(lengths, truncated):
    return SimpleNamespace(completion_ids=[[0] * n for n in lengths], truncated=torch.tensor(truncated))


def test_recipes_scale_then_shape_as_configured():
    rewards, rollout = torch.tensor([0.5, 1.0, 3.0]), _rollout([4, 30, 9], [False, True, False])
    off = GRPOLoopConfig()
    assert torch.equal(shaped_rewards(off, rewards, rollout), rewards)
    scaled = GRPOLoopConfig(reward_scaling=RewardScalingConfig(enabled=True, target_min=-1.0))
    torch.testing.assert_close(shaped_rewards(scaled, rewards, rollout), torch.tensor([0.0, 1.0, 1.0]))
    stop = GRPOLoopConfig(reward_scaling=scaled.reward_scaling,
                          reward_shaping=RewardShapingConfig(enabled=True, stop_properly_penalty_coef=0.25))
    torch.testing.assert_close(shaped_rewards(stop, rewards, rollout), torch.tensor([0.0, 0.25, 1.0]))
    overlong = GRPOLoopConfig(reward_shaping=RewardShapingConfig(enabled=True, overlong_buffer_length=10,
                                                                 overlong_buffer_penalty=1.0, max_response_length=20))
    torch.testing.assert_close(shaped_rewards(overlong, rewards, rollout), torch.tensor([0.5, 1.0 - 2.0, 3.0]))
    eos = GRPOLoopConfig(reward_shaping=RewardShapingConfig(enabled=True, missing_eos_penalty=0.5))
    torch.testing.assert_close(shaped_rewards(eos, rewards, rollout), torch.tensor([0.5, 0.5, 3.0]))
    both = GRPOLoopConfig(reward_shaping=RewardShapingConfig(enabled=True, stop_properly_penalty_coef=0.5,
                                                             missing_eos_penalty=0.5))
    torch.testing.assert_close(shaped_rewards(both, rewards, rollout), torch.tensor([0.5, 0.0, 3.0]))
