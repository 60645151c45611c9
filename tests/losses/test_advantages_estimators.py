"""Advantage clipping, GDPO, Reinforce++ and raw-reward advantages.

NeMo RL's cases come from tests/unit/algorithms/test_grpo.py (`clip_grpo_advantages_*`,
`gdpo_advantage_estimator_*`, `reinforce_plus_plus_global_normalization`) and test_ppo.py
(`raw_reward_basic_broadcast_and_masking`); prompt token rows became `group_index` values.
"""

import math

import pytest
import torch

from rmkit.losses import (
    clip_advantages,
    gdpo_advantages,
    grpo_group_advantages,
    kl_in_reward,
    raw_reward_advantages,
    reinforce_plus_plus_advantages,
    response_mask,
)

# --- clipping -----------------------------------------------------------------------------------


def test_nemo_clip_respects_bounds():
    extreme = torch.tensor([[-10.0, 15.0], [0.0, 5.0]])
    clipped = clip_advantages(extreme.clone(), advantage_clip_low=-2.0, advantage_clip_high=3.0)
    assert clipped.min().item() == -2.0 and clipped.max().item() == 3.0
    assert torch.equal(clipped, torch.tensor([[-2.0, 3.0], [0.0, 3.0]]))
    assert torch.equal(clip_advantages(extreme.clone()), extreme)  # both None: unchanged


def test_clip_one_side_and_bad_bounds():
    adv = torch.tensor([-10.0, 0.5, 15.0])
    assert torch.equal(clip_advantages(adv, advantage_clip_low=-1.0), torch.tensor([-1.0, 0.5, 15.0]))
    assert torch.equal(clip_advantages(adv, advantage_clip_high=1.0), torch.tensor([-10.0, 0.5, 1.0]))
    with pytest.raises(ValueError, match="advantage_clip_low"):
        clip_advantages(adv, advantage_clip_low=2.0, advantage_clip_high=1.0)


# --- GDPO ---------------------------------------------------------------------------------------


def _gdpo(components, group_index, **kw):
    kw.setdefault("use_leave_one_out_baseline", False)
    return gdpo_advantages(components, torch.tensor(group_index), **kw)


def test_nemo_gdpo_multiple_rewards():
    # correctness [1, 1]: std 0 -> [0, 0]; integer [1, -1]: +-1 / sqrt(2); format [1, 0]: +-0.5 / sqrt(0.5)
    # (eps aside). Sum [1.414, -1.414], mean 0, unbiased std 2 -> +-0.7071.
    components = {"correctness": torch.tensor([1.0, 1.0]), "integer": torch.tensor([1.0, -1.0]),
                  "format": torch.tensor([1.0, 0.0])}
    adv = _gdpo(components, [0, 0])
    assert adv.shape == (2,)
    torch.testing.assert_close(adv, torch.tensor([0.7071, -0.7071]), rtol=1e-5, atol=1e-8)


def test_nemo_gdpo_single_reward_is_refused():
    with pytest.raises(ValueError, match="at least two"):
        _gdpo({"correctness": torch.tensor([1.0, 3.0])}, [0, 0])


def test_nemo_gdpo_reward_weights():
    components = {"correctness": torch.tensor([1.0, 0.0, 1.0]), "format": torch.tensor([1.0, 1.0, 0.0])}
    default = _gdpo(components, [0, 0, 0])
    # a uniform positive scaling disappears in the final normalization
    torch.testing.assert_close(default, _gdpo(components, [0, 0, 0], reward_weights=[2.0, 2.0]), rtol=0, atol=1e-5)
    assert not torch.allclose(default, _gdpo(components, [0, 0, 0], reward_weights=[1.0, 0.25]), atol=1e-3)
    with pytest.raises(ValueError, match="one weight per component"):
        _gdpo(components, [0, 0, 0], reward_weights=[1.0])


def test_gdpo_matches_its_definition():
    g = torch.Generator().manual_seed(0)
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    components = {name: torch.randn(9, generator=g, dtype=torch.float64) for name in ("b", "a", "c")}
    weights = [0.5, 2.0, 1.0]  # for a, b, c (sorted names)
    got = gdpo_advantages(components, groups, reward_weights=weights)
    total = sum(w * grpo_group_advantages(components[n], groups) for w, n in zip(weights, "abc"))
    expected = (total - total.mean()) / total.std()
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert got.std().item() == pytest.approx(1.0, rel=1e-12)


def test_gdpo_with_no_spread_is_only_centered():
    same = {"a": torch.tensor([1.0, 1.0]), "b": torch.tensor([2.0, 2.0])}
    assert torch.equal(_gdpo(same, [0, 0]), torch.zeros(2))


# --- Reinforce++ --------------------------------------------------------------------------------


def test_nemo_reinforce_plus_plus_global_normalization():
    mask = torch.ones(4, 5)
    adv = reinforce_plus_plus_advantages(torch.tensor([0.0, 1.0, 2.0, 3.0]), mask, torch.zeros(4, dtype=torch.long),
                                         minus_baseline=True, use_kl_in_reward=False,
                                         reference_policy_kl_penalty=0.0001, reference_policy_kl_type="k2")
    assert ((adv * mask).sum() / mask.sum()).abs() < 1e-5
    assert adv[0, 0] < adv[1, 0] < adv[2, 0] < adv[3, 0]


def test_reinforce_plus_plus_hand_worked():
    # mean 1.5 -> [-1.5, -0.5, 0.5, 1.5] on every token; biased var 1.25 -> divide by sqrt(1.25).
    adv = reinforce_plus_plus_advantages(torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64),
                                         torch.ones(4, 3), group_size=4)
    expected = torch.tensor([-1.5, -0.5, 0.5, 1.5], dtype=torch.float64)[:, None].expand(4, 3) / math.sqrt(1.25)
    torch.testing.assert_close(adv, expected, rtol=1e-12, atol=1e-12)


def test_reinforce_plus_plus_group_of_one_and_no_baseline():
    rewards = torch.tensor([4.0, 1.0, 3.0], dtype=torch.float64)
    mask = torch.ones(3, 2)
    # groups [4] and [1, 3]: a = [0, -1, 1]; mean 0, biased var 2/3
    adv = reinforce_plus_plus_advantages(rewards, mask, torch.tensor([5, 2, 2]))
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.0, -1.0, 1.0], dtype=torch.float64) / math.sqrt(2 / 3))
    # minus_baseline=False: the raw rewards [4, 1, 3] whitened (mean 8/3, biased var 14/9)
    raw = reinforce_plus_plus_advantages(rewards, mask, minus_baseline=False)
    torch.testing.assert_close(raw[:, 0], (rewards - 8 / 3) / math.sqrt(14 / 9))


def test_reinforce_plus_plus_kl_in_reward_matches_a_loop():
    g = torch.Generator().manual_seed(1)
    rewards = torch.randn(4, generator=g, dtype=torch.float64)
    logprobs = -torch.rand(4, 5, generator=g, dtype=torch.float64)
    reference = -torch.rand(4, 5, generator=g, dtype=torch.float64)
    token_mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1], [0, 1, 1, 0, 0], [1, 1, 1, 1, 1]]).double()
    mask = response_mask(token_mask, torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64))
    adv = reinforce_plus_plus_advantages(rewards, mask, group_size=2, use_kl_in_reward=True,
                                         reference_policy_kl_penalty=0.1, reference_policy_kl_type="k3",
                                         logprobs=logprobs, reference_logprobs=reference)
    raw = {}
    for b in range(4):
        mean = (rewards[2 * (b // 2)] + rewards[2 * (b // 2) + 1]).item() / 2
        for t in range(5):
            x = (reference[b, t] - logprobs[b, t]).item()
            raw[b, t] = rewards[b].item() - mean - 0.1 * (math.exp(x) - 1 - x)
    valid = [(b, t) for b in range(4) for t in range(1, 5) if mask[b, t] > 0]
    mu = sum(raw[k] for k in valid) / len(valid)
    sd = math.sqrt(sum((raw[k] - mu) ** 2 for k in valid) / len(valid))
    for (b, t), value in raw.items():
        assert adv[b, t].item() == pytest.approx((value - mu) / sd, rel=1e-10, abs=1e-12)
    # without the gate the KL is not applied
    no_kl = reinforce_plus_plus_advantages(rewards, mask, group_size=2, logprobs=logprobs,
                                           reference_logprobs=reference, reference_policy_kl_penalty=0.1)
    assert not torch.allclose(no_kl, adv)


def test_kl_in_reward_clamps():
    lp = torch.zeros(1, 3, dtype=torch.float64)
    ref = torch.tensor([[0.5, 30.0, -30.0]], dtype=torch.float64)
    k1 = kl_in_reward(lp, ref, "k1")  # -(ref - lp), input clamped to +-20, output to +-10
    assert k1.tolist() == [[-0.5, -10.0, 10.0]]
    assert kl_in_reward(lp, ref, "k2")[0, 0].item() == pytest.approx(0.125)
    with pytest.raises(ValueError, match="k4"):
        kl_in_reward(lp, ref, "k4")


def test_response_mask_drops_position_zero_and_masked_rows():
    token_mask = torch.ones(2, 3)
    assert response_mask(token_mask, torch.tensor([1.0, 0.0])).tolist() == [[0, 1, 1], [0, 0, 0]]


# --- raw reward ---------------------------------------------------------------------------------


def test_nemo_raw_reward_broadcast():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    adv = raw_reward_advantages(torch.tensor([2.0, -1.0]), mask, normalize_advantages=False)
    torch.testing.assert_close(adv, torch.tensor([[2.0] * 4, [-1.0] * 4]))


def test_raw_reward_normalized_over_the_mask():
    # masked tokens: three 2s and two -1s: mean 0.8, biased var (3 * 1.44 + 2 * 3.24) / 5 = 2.16
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    adv = raw_reward_advantages(torch.tensor([2.0, -1.0], dtype=torch.float64), mask, normalize_advantages=True)
    assert adv[0, 0].item() == pytest.approx(1.2 / math.sqrt(2.16), rel=1e-12)
    assert adv[1, 3].item() == pytest.approx(-1.8 / math.sqrt(2.16), rel=1e-12)
