"""GAE: NeMo RL's test_ppo.py `gae_*` cases (inputs and expectations unchanged; its masks start at
position 0, which `gae_advantages` takes as given), a slow per-token loop, value alignment."""

import math

import pytest
import torch

from rmkit.losses import aligned_values, gae_advantages, response_mask


def _gae(rewards, values, mask, gae_lambda=0.95, gae_gamma=1.0, **kw):
    return gae_advantages(rewards, values, mask, gae_gamma=gae_gamma, gae_lambda=gae_lambda, **kw)


def test_nemo_basic_computation():
    values = torch.tensor([[0.5, 0.5, 0.5, 0.5]])
    adv, returns = _gae(torch.tensor([1.0]), values, torch.ones(1, 4), gae_lambda=1.0)
    assert adv.shape == returns.shape == (1, 4)
    torch.testing.assert_close(returns, adv + values)
    # lambda = gamma = 1: Monte Carlo return (1 at every step) minus V
    torch.testing.assert_close(adv, torch.full((1, 4), 0.5))


def test_nemo_lambda_zero_is_one_step_td():
    # token rewards [0, 0, 5]; deltas 0 + 2 - 1, 0 + 3 - 2, 5 + 0 - 3
    adv, _ = _gae(torch.tensor([5.0]), torch.tensor([[1.0, 2.0, 3.0]]), torch.ones(1, 3), gae_lambda=0.0)
    torch.testing.assert_close(adv, torch.tensor([[1.0, 1.0, 2.0]]))


def test_nemo_shape_and_masking():
    mask = torch.ones(3, 5)
    mask[1, 3:] = 0
    mask[2, 4:] = 0
    adv, returns = _gae(torch.tensor([1.0, 2.0, 3.0]), torch.randn(3, 5), mask)
    assert adv.shape == returns.shape == (3, 5)
    assert adv[1, 3:].abs().sum() == 0 and adv[2, 4:].abs().sum() == 0


def test_nemo_normalize_advantages():
    torch.manual_seed(0)
    adv, _ = _gae(torch.randn(8) * 5, torch.randn(8, 10), torch.ones(8, 10), normalize_advantages=True)
    assert adv.mean().abs() < 0.1 and (adv.std() - 1.0).abs() < 0.2
    # tighter than NeMo RL's check: the whitening is exact (unbiased std 1 up to its 1e-8 terms)
    assert adv.mean().abs() < 1e-5 and (adv.std() - 1.0).abs() < 1e-5


def test_nemo_kl_penalty_in_rewards():
    kw = dict(gae_lambda=1.0, reference_policy_kl_penalty=0.1, reference_policy_kl_type="k1")
    rewards, mask, values = torch.tensor([1.0]), torch.ones(1, 3), torch.zeros(1, 3)
    logprobs = torch.tensor([[-1.0, -2.0, -1.5]])
    no_kl, _ = _gae(rewards, values, mask, **kw)
    same, _ = _gae(rewards, values, mask, use_kl_in_reward=True, logprobs=logprobs,
                   reference_logprobs=logprobs.clone(), **kw)
    torch.testing.assert_close(same, no_kl)
    divergent = torch.tensor([[-3.0, -4.0, -3.5]])
    with_kl, _ = _gae(rewards, values, mask, use_kl_in_reward=True, logprobs=logprobs,
                      reference_logprobs=divergent, **kw)
    assert not torch.allclose(with_kl, no_kl)
    # k1 = -(ref - logp) = 2 per token, weighted 0.1: token rewards [-0.2, -0.2, 0.8]; A_t = sum from t
    torch.testing.assert_close(with_kl, torch.tensor([[0.4, 0.6, 0.8]]))
    gated_off, _ = _gae(rewards, values, mask, use_kl_in_reward=False, logprobs=logprobs,
                        reference_logprobs=divergent, **kw)
    torch.testing.assert_close(gated_off, no_kl)


def test_nemo_vapo_decoupled_lambda():
    torch.manual_seed(0)
    values = torch.randn(2, 4)
    adv, returns = _gae(torch.tensor([1.0, 2.0]), values, torch.ones(2, 4),
                        gae_lambda_value=1.0, gae_lambda_policy=0.5)
    assert not torch.allclose(returns, adv + values, atol=1e-5)
    # returns come from lambda 1 (Monte Carlo: the reward at every step), advantages from lambda 0.5
    torch.testing.assert_close(returns, torch.tensor([[1.0] * 4, [2.0] * 4]))
    adv_half, _ = _gae(torch.tensor([1.0, 2.0]), values, torch.ones(2, 4), gae_lambda=0.5)
    torch.testing.assert_close(adv, adv_half)


def test_nemo_length_adaptive_lambda():
    # lambda = 1 - 1 / max(alpha * length, 1): alpha 0.05 with 3 and 8 tokens clamps to 0 (one-step TD)
    mask = torch.zeros(2, 10)
    mask[0, :3] = 1
    mask[1, :8] = 1
    torch.manual_seed(0)
    values = torch.randn(2, 10)
    adaptive, _ = _gae(torch.tensor([1.0, 2.0]), values, mask, length_adaptive_alpha=0.05)
    td, _ = _gae(torch.tensor([1.0, 2.0]), values, mask, gae_lambda=0.0)
    torch.testing.assert_close(adaptive, td)
    # alpha 0.5: row 0 gets 1 - 1/1.5 = 1/3, row 1 gets 1 - 1/4 = 3/4
    adaptive, _ = _gae(torch.tensor([1.0, 2.0]), values, mask, length_adaptive_alpha=0.5)
    for row, lam in ((0, 1 / 3), (1, 0.75)):
        fixed, _ = _gae(torch.tensor([1.0, 2.0]), values, mask, gae_lambda=lam)
        torch.testing.assert_close(adaptive[row], fixed[row])


def test_nemo_carry_forward_over_an_interior_gap():
    rewards = torch.tensor([1.0])
    kw = dict(gae_lambda=0.95, gae_gamma=0.99)
    gap, _ = _gae(rewards, torch.tensor([[0.1, 0.2, 999.0, 0.4, 0.5]]), torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0]]), **kw)
    no_gap, _ = _gae(rewards, torch.tensor([[0.1, 0.2, 0.4, 0.5]]), torch.ones(1, 4), **kw)
    torch.testing.assert_close(gap[0, [0, 1, 3, 4]], no_gap[0])
    assert gap[0, 2] == 0


def _loop_gae(rewards, values, mask, gamma, lam, kl=None):
    adv = [[0.0] * len(values[0]) for _ in values]
    for b in range(len(values)):
        steps = [t for t in range(len(values[b])) if mask[b][t]]
        next_value = next_adv = 0.0
        for k, t in reversed(list(enumerate(steps))):
            r = (rewards[b] if k == len(steps) - 1 else 0.0) - (kl[b][t] if kl else 0.0)
            delta = r + gamma * next_value - values[b][t]
            next_adv = delta + gamma * lam * next_adv
            next_value = values[b][t]
            adv[b][t] = next_adv
    return adv


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.5), (0.99, 1.0)])
def test_gae_matches_a_loop(gamma, lam):
    g = torch.Generator().manual_seed(4)
    rewards = torch.randn(4, generator=g, dtype=torch.float64)
    values = torch.randn(4, 7, generator=g, dtype=torch.float64)
    token_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [0, 1, 1, 0, 1, 1, 1],
                               [0, 0, 0, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]], dtype=torch.float64)
    mask = response_mask(token_mask, torch.ones(4, dtype=torch.float64))
    values = torch.where(mask > 0, values, torch.full_like(values, float("nan")))  # padding never read
    logp = -torch.rand(4, 7, generator=g, dtype=torch.float64)
    ref = -torch.rand(4, 7, generator=g, dtype=torch.float64)
    adv, returns = gae_advantages(rewards, values, mask, gae_gamma=gamma, gae_lambda=lam, use_kl_in_reward=True,
                                  reference_policy_kl_penalty=0.05, reference_policy_kl_type="k3",
                                  logprobs=logp, reference_logprobs=ref)
    x = ref - logp
    kl = (0.05 * (torch.exp(x) - 1 - x)).tolist()
    expected = _loop_gae(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam, kl)
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    valid = mask > 0
    torch.testing.assert_close(returns[valid], (adv + values)[valid], rtol=1e-12, atol=1e-12)
    assert torch.equal(returns[~valid], torch.zeros(int((~valid).sum()), dtype=torch.float64))


def test_gae_discounting_by_hand():
    # one row, 2 tokens, V = 0, reward 1, gamma 0.5, lambda 1: A = [0.5, 1]
    adv, _ = _gae(torch.tensor([1.0]), torch.zeros(1, 2), torch.ones(1, 2), gae_lambda=1.0, gae_gamma=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 1.0]]))
    assert math.isclose(adv[0, 0].item(), 0.5)


def test_aligned_values_shift_head_output():
    head = torch.tensor([[[1.0], [2.0], [3.0]]])  # [B, S, 1]: position t is V(input_ids[:t+1])
    assert aligned_values(head).tolist() == [[0.0, 1.0, 2.0]]
    assert aligned_values(head[..., 0]).tolist() == [[0.0, 1.0, 2.0]]


def _trl_gae(scores, values, logprobs, ref_logprobs, lengths, ended, kl_coef, gamma, lam):
    """TRL 1.12.0's PPOTrainer steps 4 and 6 on response-aligned `[B, G]` lists, as its loop runs them: k1 KL in
    the reward through each row's last token, the score one position later for a row that ended with room
    (`sequence_length + 1 < G`), values kept through that position, one GAE pass over all G positions, advantages
    whitened over the rows' tokens (unbiased variance) and returns over the tokens plus that position."""
    width = len(values[0])
    adv_rows, ret_rows, policy, critic = [], [], [], []
    for b in range(len(values)):
        last = lengths[b] - 1
        end = last + 1 if ended[b] and last + 1 < width else last
        v = [values[b][t] if t <= last + 1 else 0.0 for t in range(width)]
        r = [-kl_coef * (logprobs[b][t] - ref_logprobs[b][t]) if t <= last else 0.0 for t in range(width)]
        r[end] += scores[b]
        adv, running = [0.0] * width, 0.0
        for t in reversed(range(width)):
            next_value = v[t + 1] if t < width - 1 else 0.0
            running = r[t] + gamma * next_value - v[t] + gamma * lam * running
            adv[t] = running
        adv_rows.append(adv)
        ret_rows.append([a + x for a, x in zip(adv, v)])
        policy.append([t <= last for t in range(width)])
        critic.append([t <= end for t in range(width)])
    flat = [a for row, keep in zip(adv_rows, policy) for a, k in zip(row, keep) if k]
    mean = sum(flat) / len(flat)
    var = sum((a - mean) ** 2 for a in flat) / (len(flat) - 1)
    whitened = [[(a - mean) / math.sqrt(var + 1e-8) if k else 0.0 for a, k in zip(row, keep)]
                for row, keep in zip(adv_rows, policy)]
    returns = [[x if k else 0.0 for x, k in zip(row, keep)] for row, keep in zip(ret_rows, critic)]
    return whitened, returns


def test_value_mask_puts_the_score_after_the_last_token_as_trl_does():
    # Rows of response length 3 (ended, room after it), 5 (ran to the limit G = 5), 5 (ended exactly at the limit:
    # no room, so the score stays on its last token) and 2 (ended), after prompts of 2, 1, 3 and 2 tokens.
    g = torch.Generator().manual_seed(7)
    width, prompts, lengths, ended = 5, [2, 1, 3, 2], [3, 5, 5, 2], [True, False, True, True]
    scores = torch.randn(4, generator=g, dtype=torch.float64)
    resp_values = torch.randn(4, width, generator=g, dtype=torch.float64)
    resp_logp = -torch.rand(4, width, generator=g, dtype=torch.float64)
    resp_ref = -torch.rand(4, width, generator=g, dtype=torch.float64)
    expected_adv, expected_ret = _trl_gae(scores.tolist(), resp_values.tolist(), resp_logp.tolist(),
                                          resp_ref.tolist(), lengths, ended, 0.05, 1.0, 0.95)
    # rmkit's layout: [B, S] aligned with input_ids, response token i of row b at prompts[b] + i; the state after
    # a finished row's last token is one position past it, where its logprobs are padding (anything).
    seq = max(prompts) + width + 1
    mask, value_mask = torch.zeros(4, seq, dtype=torch.float64), torch.zeros(4, seq, dtype=torch.float64)
    values = torch.full((4, seq), float("nan"), dtype=torch.float64)
    logp, ref = torch.randn(4, seq, generator=g, dtype=torch.float64), torch.randn(4, seq, generator=g, dtype=torch.float64)
    for b, (p, n) in enumerate(zip(prompts, lengths)):
        mask[b, p:p + n] = 1
        room = ended[b] and n < width
        value_mask[b, p:p + n + room] = 1
        values[b, p:p + n + room] = resp_values[b, :n + room]
        logp[b, p:p + n], ref[b, p:p + n] = resp_logp[b, :n], resp_ref[b, :n]
    adv, returns = gae_advantages(scores, values, mask, value_mask=value_mask, gae_gamma=1.0, gae_lambda=0.95,
                                  normalize_advantages=True, use_kl_in_reward=True, reference_policy_kl_penalty=0.05,
                                  reference_policy_kl_type="k1", logprobs=logp, reference_logprobs=ref)
    for b, p in enumerate(prompts):  # 1e-8: the whitening keeps NeMo RL's 1e-8 in its divisors, TRL's has none
        torch.testing.assert_close(adv[b, p:p + width], torch.tensor(expected_adv[b], dtype=torch.float64),
                                   rtol=1e-8, atol=1e-8)
        torch.testing.assert_close(returns[b, p:p + width], torch.tensor(expected_ret[b], dtype=torch.float64),
                                   rtol=1e-10, atol=1e-10)
        assert not adv[b, :p].any() and not returns[b, :p].any() and not adv[b, p + width:].any()
    # the score one past the end is the return there: the critic learns to predict it
    assert returns[0, 2 + 3].item() == pytest.approx(scores[0].item())
    # without value_mask (the default) the score is on the last token: the usual GAE
    plain, _ = gae_advantages(scores, values, mask, gae_gamma=1.0, gae_lambda=0.95, normalize_advantages=True,
                              use_kl_in_reward=True, reference_policy_kl_penalty=0.05, reference_policy_kl_type="k1",
                              logprobs=logp, reference_logprobs=ref)
    same, _ = gae_advantages(scores, values, mask, value_mask=mask, gae_gamma=1.0, gae_lambda=0.95,
                             normalize_advantages=True, use_kl_in_reward=True, reference_policy_kl_penalty=0.05,
                             reference_policy_kl_type="k1", logprobs=logp, reference_logprobs=ref)
    torch.testing.assert_close(plain, same, rtol=0, atol=0)
    assert not torch.allclose(plain, adv)
