"""NeMo RL's ClippedPGLossFn unit tests, re-created against rmkit (tests/unit/algorithms/test_loss_functions.py).

Inputs, configs and expected values are NeMo RL's; only the call differs. rmkit's loss takes
logits, not log-probs, so each test builds logits whose next-token log-probs are the log-probs
NeMo RL hands its loss (`_logits_for`), and where NeMo RL differentiates with respect to the
log-probs, the logit gradient is divided by d logp / d logit. rmkit's config has six required
keys, which NeMo RL defaults: `nemo_cfg` fills them with NeMo RL's defaults. NeMo RL's assertions
(AssertionError) are ValueErrors here. Float32, as in NeMo RL, with its tolerances: torch's float32
defaults (rtol 1.3e-6, atol 1e-5) unless a test states otherwise. NeMo RL skips most of these
without a GPU; here they run on the CPU.
"""

import math

import pytest
import torch

from rmkit.losses import ClippedPGLossFn

# The log-probs NeMo RL's tests use most: ratios exp(curr - prev) of about 0.5, 1 and 1.5 at prev = -1.
ADV = torch.tensor([[1.0, -1.0, 2.0]])
PREV = torch.tensor([[-1.0, -1.0, -1.0]])
CURR = torch.tensor([[-1.69315, -1.0, -0.59453]])
GEN = torch.tensor([[-0.5, -1.5, -0.8]])


def nemo_cfg(**overrides):
    return dict(overrides)


def _data(batch_size=1, seq_len=4):
    """NeMo RL's test batch: position 0 of each row masked, all rows valid, log-probs 0."""
    token_mask = torch.ones(batch_size, seq_len, dtype=torch.int64)
    token_mask[:, 0] = 0
    return {
        "input_ids": torch.zeros(batch_size, seq_len, dtype=torch.int64),  # _logits_for targets token 0
        "token_mask": token_mask,
        "sample_mask": torch.ones(batch_size, dtype=torch.int64),
        "advantages": torch.zeros(batch_size, seq_len),
        "prev_logprobs": torch.zeros(batch_size, seq_len),
        "reference_policy_logprobs": torch.zeros(batch_size, seq_len),
        "generation_logprobs": torch.zeros(batch_size, seq_len),
    }


def _logits_for(curr):
    """Logits `[B, S, 2]` (a leaf) whose log-prob of token 0 at position t is `curr[:, t]` (`[B, S-1]`, <= 0).

    log_softmax([0, log(e^-c - 1)])[0] = -log(e^-c) = c.
    """
    logits = torch.zeros(curr.shape[0], curr.shape[1] + 1, 2)
    logits[:, :-1, 1] = torch.log(torch.expm1(-curr))
    return logits.requires_grad_()


def _counts(data):
    gvs = data["sample_mask"].sum()
    return gvs, (data["sample_mask"][:, None] * data["token_mask"]).sum()


def _run(cfg, data, curr):
    return ClippedPGLossFn(cfg)(_logits_for(curr), data, *_counts(data))


def _fill(data, **rows):
    """Set `data[key][:, 1:]` (the three response positions) for each key."""
    for key, value in rows.items():
        data[key][:, 1:] = value
    return data


def test_ppo_clipping():
    # test_clipped_pg_loss_ppo_clipping. Ratios [0.5, 1, 1.5] -> clamped [0.8, 1, 1.2];
    # max(-A r, -A clip(r)) = [-0.5, 1.0, -2.4], mean -0.6333.
    cfg = nemo_cfg(reference_policy_kl_penalty=0.0)
    data = _fill(_data(), advantages=ADV, prev_logprobs=PREV)
    ratios = torch.exp(CURR - PREV)
    clamped = ratios.clamp(0.8, 1.2)
    expected = torch.max(-ADV * ratios, -ADV * clamped).mean()
    assert torch.allclose(expected, torch.tensor(-0.6333), rtol=1e-3)
    loss, _ = _run(cfg, data, CURR)
    torch.testing.assert_close(loss, expected)


def test_reinforce_mode():
    # test_clipped_pg_loss_reinforce_mode: -A * curr = [0.5, -1.0, 3.0], mean 0.8333.
    cfg = nemo_cfg(reference_policy_kl_penalty=0.0, disable_ppo_ratio=True, ratio_clip_min=0.0, ratio_clip_max=0.0)
    curr = torch.tensor([[-0.5, -1.0, -1.5]])
    data = _fill(_data(), advantages=ADV)
    expected = (-ADV * curr).mean()
    assert torch.allclose(expected, torch.tensor(0.8333), rtol=1e-3)
    loss, _ = _run(cfg, data, curr)
    torch.testing.assert_close(loss, expected)


def test_force_on_policy_ratio():
    # test_clipped_pg_loss_force_on_policy_ratio: ratios forced to 1 -> loss mean(-A) = -2/3, and
    # every ratio metric exactly 1.
    cfg = nemo_cfg(reference_policy_kl_penalty=0.0, force_on_policy_ratio=True)
    data = _fill(_data(), advantages=ADV, prev_logprobs=PREV)
    loss, metrics = _run(cfg, data, CURR)
    torch.testing.assert_close(loss, (-ADV).mean(), rtol=1e-3, atol=1e-3)
    for key in ("probs_ratio", "probs_ratio_clamped", "probs_ratio_min", "probs_ratio_max",
                "probs_ratio_clamped_min", "probs_ratio_clamped_max"):
        assert metrics[key].item() == 1.0, key


def test_force_on_policy_ratio_ignores_prev_logprobs():
    # test_clipped_pg_loss_force_on_policy_ratio_ignores_prev_logprobs: prev = curr or -10, same loss.
    cfg = nemo_cfg(reference_policy_kl_penalty=0.0, force_on_policy_ratio=True)
    curr = torch.tensor([[-1.0, -1.0, -1.0]])
    loss_1, metrics_1 = _run(cfg, _fill(_data(), prev_logprobs=curr), curr)
    loss_2, metrics_2 = _run(cfg, _fill(_data(), prev_logprobs=torch.full((1, 3), -10.0)), curr)
    torch.testing.assert_close(loss_1, loss_2)
    assert metrics_1["probs_ratio"].item() == metrics_2["probs_ratio"].item() == 1.0
    # rmkit: not read at all, so it may be absent.
    data = _data()
    del data["prev_logprobs"]
    torch.testing.assert_close(_run(cfg, data, curr)[0], loss_1)


@pytest.mark.parametrize(
    "incompatible",
    [
        {"disable_ppo_ratio": True},
        {"force_on_policy_ratio": True},
        {"ratio_clip_c": 3.0},
        {"sequence_level_importance_ratios": True, "token_level_loss": False},
    ],
)
def test_cispo_incompatible_configs(incompatible):
    # test_clipped_pg_loss_cispo_incompatibility_asserts; the message names the conflicting key.
    key = next(k for k in incompatible if k != "token_level_loss")
    with pytest.raises(ValueError, match=f"use_cispo is incompatible with {key}"):
        ClippedPGLossFn(nemo_cfg(reference_policy_kl_penalty=0.0, use_cispo=True, **incompatible))


def test_cispo():
    # test_clipped_pg_loss_cispo: -A * sg(clip(r)) * curr, averaged.
    cfg = nemo_cfg(reference_policy_kl_penalty=0.0, use_cispo=True)
    data = _fill(_data(), advantages=ADV, prev_logprobs=PREV)
    clamped = torch.exp(CURR - PREV).clamp(0.8, 1.2)
    loss, _ = _run(cfg, data, CURR)
    torch.testing.assert_close(loss, (-ADV * clamped * CURR).mean(), rtol=1e-3, atol=1e-3)


def test_cispo_with_importance_sampling_correction():
    # test_clipped_pg_loss_cispo_with_importance_sampling_correction: times exp(prev - gen) per token.
    cfg = nemo_cfg(reference_policy_kl_penalty=0.0, use_cispo=True, use_importance_sampling_correction=True)
    data = _fill(_data(), advantages=ADV, prev_logprobs=PREV, generation_logprobs=GEN)
    clamped = torch.exp(CURR - PREV).clamp(0.8, 1.2)
    expected = (torch.exp(PREV - GEN) * -ADV * clamped * CURR).mean()
    loss, _ = _run(cfg, data, CURR)
    torch.testing.assert_close(loss, expected, rtol=1e-3, atol=1e-3)


def test_kl_penalty():
    # test_clipped_pg_loss_kl_penalty: A = 0; ref - curr = [-1, 0, 1]; k3 = [0.368, 0, 0.718],
    # mean 0.362; loss = 0.1 * 0.362.
    cfg = nemo_cfg(reference_policy_kl_penalty=0.1)
    curr = torch.tensor([[0.0, -1.0, -2.0]])
    data = _fill(_data(), reference_policy_logprobs=torch.tensor([[-1.0, -1.0, -1.0]]))
    r = torch.tensor([[-1.0, 0.0, 1.0]])
    expected = 0.1 * (torch.exp(r) - r - 1).mean()
    assert torch.allclose(expected, torch.tensor(0.0362), rtol=1e-3)
    loss, _ = _run(cfg, data, curr)
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("use_on_policy_kl_approximation", [False, True])
def test_kl_gradient_includes_sampling_term(use_on_policy_kl_approximation):
    # test_clipped_pg_loss_kl_gradient_includes_sampling_term: d/d curr of beta * w * k3 (per token,
    # over 2 tokens) = beta * w * (k3 + 1 - e^r) / 2, w = exp(curr - gen) or 1; the difference of the
    # gradients with beta and with beta = 0 isolates it.
    curr = torch.tensor([[-1.2, -0.7]])
    ref = torch.tensor([[-0.9, -1.1]])
    gen = torch.tensor([[-1.5, -0.4]])
    beta = 0.3
    data = _data(seq_len=3)
    _fill(data, prev_logprobs=torch.tensor([[-1.0, -0.8]]), generation_logprobs=gen,
          reference_policy_logprobs=ref, advantages=torch.tensor([[0.4, -0.2]]))

    def curr_gradient(kl_penalty):
        logits = _logits_for(curr)
        cfg = nemo_cfg(reference_policy_kl_penalty=kl_penalty,
                       use_on_policy_kl_approximation=use_on_policy_kl_approximation)
        loss, _ = ClippedPGLossFn(cfg)(logits, data, *_counts(data))
        loss.backward()
        return logits.grad[:, :-1, 0] / (1 - torch.exp(curr))  # d logp / d logit_0 = 1 - p

    r = ref - curr
    weight = torch.exp(curr - gen) if use_on_policy_kl_approximation else torch.ones_like(curr)
    expected = beta * weight * ((torch.exp(r) - 1 - r) + (1 - torch.exp(r))) / curr.numel()
    torch.testing.assert_close(curr_gradient(beta) - curr_gradient(0.0), expected)


def test_masking():
    # test_clipped_pg_loss_masking: masking one more token changes the loss; sample_mask [1, 0]
    # gives the loss of row 0 alone.
    torch.manual_seed(0)
    data = _data(batch_size=2)
    data["input_ids"] = torch.randint(0, 8, (2, 4))
    logits = torch.randn(2, 4, 8)
    data["prev_logprobs"] = torch.randn(2, 4) * 0.1
    data["reference_policy_logprobs"] = torch.randn(2, 4) * 0.1
    data["advantages"] = torch.randn(2, 4) + 1.0
    loss_fn = ClippedPGLossFn(nemo_cfg(reference_policy_kl_penalty=0.1))
    loss_default, _ = loss_fn(logits, data, *_counts(data))

    token_masked = {**data, "token_mask": data["token_mask"].clone()}
    token_masked["token_mask"][0, 1] = 0
    loss_token_masked, _ = loss_fn(logits, token_masked, *_counts(token_masked))
    assert not torch.isclose(loss_default, loss_token_masked, atol=1e-4)

    sample_masked = {**data, "sample_mask": torch.tensor([1, 0])}
    loss_sample_masked, _ = loss_fn(logits, sample_masked, *_counts(sample_masked))
    row_0 = {key: value[0:1] for key, value in data.items()}
    loss_row_0, _ = loss_fn(logits[0:1], row_0, *_counts(row_0))
    torch.testing.assert_close(loss_sample_masked, loss_row_0)


def test_zero_mask():
    # test_clipped_pg_loss_zero_mask: no valid token -> the loss is exactly 0.
    torch.manual_seed(0)
    data = _data()
    data["token_mask"] = torch.zeros_like(data["token_mask"])
    loss, _ = ClippedPGLossFn(nemo_cfg(reference_policy_kl_penalty=0.1))(torch.randn(1, 4, 8), data, *_counts(data))
    torch.testing.assert_close(loss, torch.tensor(0.0))


def test_on_policy_kl_importance_sampling():
    # test_clipped_pg_loss_on_policy_kl_importance_sampling (beta = 0, as NeMo RL has it): the
    # actor loss weighted by exp(prev - gen) = [0.6065, 1.6487, 0.8187] -> mean -0.2065.
    cfg = nemo_cfg(reference_policy_kl_penalty=0.0, use_on_policy_kl_approximation=True,
                   use_importance_sampling_correction=True)
    ref = torch.tensor([[-1.0, -1.0, -1.0]])
    data = _fill(_data(), advantages=ADV, prev_logprobs=PREV, generation_logprobs=GEN,
                 reference_policy_logprobs=ref)
    ratios = torch.exp(CURR - PREV)
    actor = (torch.exp(PREV - GEN) * torch.max(-ADV * ratios, -ADV * ratios.clamp(0.8, 1.2))).mean()
    assert torch.allclose(actor, torch.tensor(-0.2065), rtol=1e-3)
    r = ref - CURR
    kl = (torch.exp(CURR - GEN) * (torch.exp(r) - r - 1)).mean()  # [0.09308, 0, 0.08855] -> 0.0605
    assert torch.allclose(kl, torch.tensor(0.060543), rtol=1e-3)
    loss, _ = _run(cfg, data, CURR)
    torch.testing.assert_close(loss, actor + 0.0 * kl, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("sequence_level_importance_ratios", [True, False])
def test_truncated_importance_sampling(sequence_level_importance_ratios):
    # test_clipped_pg_loss_on_policy_truncated_importance_sampling, "tis" with max 0.8.
    # Token level: weights [0.6065, 1.6487, 0.8187] -> [0.6065, 0.8, 0.8], loss -0.4744.
    # GSPO: ratio exp(mean log r) = 0.9086 per sequence, weight exp(sum(prev - gen)) = 0.8187 -> 0.8,
    # loss -0.4846.
    cfg = nemo_cfg(reference_policy_kl_penalty=0.0, use_importance_sampling_correction=True,
                   truncated_importance_sampling_ratio=0.8, truncated_importance_sampling_type="tis")
    if sequence_level_importance_ratios:
        cfg.update(sequence_level_importance_ratios=True, token_level_loss=False)
    data = _fill(_data(), advantages=ADV, prev_logprobs=PREV, generation_logprobs=GEN,
                 reference_policy_logprobs=torch.tensor([[-1.0, -1.0, -1.0]]))
    if sequence_level_importance_ratios:
        ratios = torch.exp((CURR - PREV).mean(-1, keepdim=True)).repeat(1, 3)
        weights = torch.exp((PREV - GEN).sum(-1, keepdim=True))
    else:
        ratios = torch.exp(CURR - PREV)
        weights = torch.exp(PREV - GEN)
    expected = (weights.clamp(max=0.8) * torch.max(-ADV * ratios, -ADV * ratios.clamp(0.8, 1.2))).mean()
    want = -0.4846 if sequence_level_importance_ratios else -0.4744
    assert torch.allclose(expected, torch.tensor(want), rtol=1e-3)
    loss, _ = _run(cfg, data, CURR)
    torch.testing.assert_close(loss, expected, atol=1e-4, rtol=1e-3)


def test_icepop_importance_sampling():
    # test_clipped_pg_loss_icepop_importance_sampling: on policy (curr = prev), weights
    # exp(prev - gen) = [0.6065, 12.18, 0.8187]; ICE-POP [0.5, 5] zeroes the second.
    cfg = nemo_cfg(reference_policy_kl_penalty=0.0, use_importance_sampling_correction=True,
                   truncated_importance_sampling_type="icepop", truncated_importance_sampling_ratio=5.0,
                   truncated_importance_sampling_ratio_min=0.5)
    gen = torch.tensor([[-0.5, -3.5, -0.8]])
    data = _fill(_data(), advantages=ADV, prev_logprobs=PREV, generation_logprobs=gen)
    weights = torch.exp(PREV - gen)
    kept = torch.where((weights >= 0.5) & (weights <= 5.0), weights, torch.zeros_like(weights))
    loss, _ = _run(cfg, data, PREV)
    torch.testing.assert_close(loss, (kept * -ADV).mean(), atol=1e-4, rtol=1e-3)


def test_reports_is_oob_ratio_tis():
    # test_clipped_pg_loss_reports_is_oob_ratio_tis: weights [1, 3, 0.5], max 2 -> 1 of 3 out.
    cfg = nemo_cfg(reference_policy_kl_penalty=0.0, use_importance_sampling_correction=True,
                   truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=2.0)
    data = _fill(_data(), advantages=torch.ones(1, 3), prev_logprobs=torch.log(torch.tensor([1.0, 3.0, 0.5])))
    _, metrics = _run(cfg, data, torch.zeros(1, 3))
    assert metrics["is_oob_ratio"].item() == pytest.approx(1.0 / 3.0)


@pytest.mark.parametrize("tis_type", ["tis", "icepop", "seq-mask-tis"])
def test_rejects_tis_min_above_max(tis_type):
    # test_clipped_pg_loss_rejects_tis_min_above_max.
    cfg = nemo_cfg(use_importance_sampling_correction=True, truncated_importance_sampling_type=tis_type,
                   truncated_importance_sampling_ratio=1.0, truncated_importance_sampling_ratio_min=2.0)
    with pytest.raises(ValueError, match="truncated_importance_sampling_ratio_min must be <= "
                                         "truncated_importance_sampling_ratio"):
        ClippedPGLossFn(cfg)


@pytest.mark.parametrize(
    "tis_min,expected_weights,expected_oob_ratio",
    [(None, [0.1, 1.0, 2.0], 1.0 / 3.0), (0.5, [0.5, 1.0, 2.0], 2.0 / 3.0)],
)
def test_tis_min_bound_defaults_to_zero(tis_min, expected_weights, expected_oob_ratio):
    # test_clipped_pg_loss_tis_min_bound_defaults_to_zero: on policy, weights [0.1, 1, 3] clamped
    # to [min or 0, 2]; loss -mean(weights). NeMo RL feeds log-probs log [0.1, 1, 3] with gen = 0;
    # logits cannot give a log-prob > 0, so both are shifted by -log 3: the same weights.
    cfg = nemo_cfg(reference_policy_kl_penalty=0.0, use_importance_sampling_correction=True,
                   force_on_policy_ratio=True, truncated_importance_sampling_type="tis",
                   truncated_importance_sampling_ratio=2.0, truncated_importance_sampling_ratio_min=tis_min)
    shift = math.log(3.0)
    data = _fill(_data(), advantages=torch.ones(1, 3), generation_logprobs=torch.full((1, 3), -shift))
    loss, metrics = _run(cfg, data, torch.log(torch.tensor([[0.1, 1.0, 3.0]])) - shift)
    torch.testing.assert_close(loss, -torch.tensor(expected_weights).mean())
    assert metrics["is_oob_ratio"].item() == pytest.approx(expected_oob_ratio)


def test_seq_mask_tis():
    # test_clipped_pg_loss_seq_mask_tis: geometric-mean weight exp(0.0005) in [0.999, 1.002]: kept,
    # loss mean(exp(prev - gen) * -A). A -inf generation log-prob then leaves the loss finite.
    cfg = nemo_cfg(reference_policy_kl_penalty=0.0, use_importance_sampling_correction=True,
                   truncated_importance_sampling_type="seq-mask-tis", truncated_importance_sampling_ratio=1.002,
                   truncated_importance_sampling_ratio_min=0.999)
    gen = torch.full((1, 3), -1.0005)
    data = _fill(_data(), advantages=ADV, prev_logprobs=PREV, generation_logprobs=gen)
    loss, _ = _run(cfg, data, PREV)
    torch.testing.assert_close(loss, (torch.exp(PREV - gen) * -ADV).mean(), atol=1e-4, rtol=1e-3)
    data["generation_logprobs"][0, 2] = float("-inf")
    loss, _ = _run(cfg, data, PREV)
    assert torch.isfinite(loss)


def test_dual_clip():
    # test_clipped_pg_loss_dual_clip: ratios [0.5, 1, 10], A = [1, -1, -4], c = 3:
    # max(-A r, -A clip(r)) = [-0.5, 1, 40]; where A < 0, min with -A c = [.., 3, 12] -> [-0.5, 1, 12].
    cfg = nemo_cfg(reference_policy_kl_penalty=0.0, ratio_clip_c=3.0)
    adv = torch.tensor([[1.0, -1.0, -4.0]])
    prev = torch.tensor([[-1.0, -1.0, -3.0]])
    curr = torch.tensor([[-1.69315, -1.0, -0.69741]])
    data = _fill(_data(), advantages=adv, prev_logprobs=prev)
    ratios = torch.exp(curr - prev)
    clip_loss = torch.max(-adv * ratios, -adv * ratios.clamp(0.8, 1.2))
    clip_loss = torch.where(adv < 0, torch.min(clip_loss, -adv * 3.0), clip_loss)
    assert torch.allclose(clip_loss, torch.tensor([[-0.5, 1.0, 12.0]]), rtol=1e-3)
    loss, _ = _run(cfg, data, curr)
    torch.testing.assert_close(loss, clip_loss.mean())


def test_entropy():
    # test_clipped_pg_loss_entropy: approx_entropy = -mean(exp(curr - gen) * curr).
    curr = torch.tensor([[-0.5, -1.0, -1.5]])
    gen = torch.tensor([[-0.6, -1.1, -1.6]])
    data = _fill(_data(), prev_logprobs=torch.tensor([[-0.4, -0.9, -1.4]]), generation_logprobs=gen)
    _, metrics = _run(nemo_cfg(reference_policy_kl_penalty=0.0), data, curr)
    expected = -(torch.exp(curr - gen) * curr).mean()
    torch.testing.assert_close(metrics["approx_entropy"], expected, rtol=1e-3, atol=1e-5)


GSPO = {"reference_policy_kl_penalty": 0.0, "sequence_level_importance_ratios": True, "token_level_loss": False}


def test_gspo():
    # test_clipped_pg_loss_gspo: one ratio exp(mean(curr - prev)) = 0.9086, inside [0.8, 1.2]:
    # -A * 0.9086 = [-0.9086, 0.9086, -1.8171], mean -0.6057.
    data = _fill(_data(), advantages=ADV, prev_logprobs=PREV)
    ratios = torch.exp((CURR - PREV).mean(-1, keepdim=True)).repeat(1, 3)
    assert torch.allclose(ratios, torch.full((1, 3), 0.9086), rtol=1e-3)
    expected = torch.max(-ADV * ratios, -ADV * ratios.clamp(0.8, 1.2)).mean()
    assert torch.allclose(expected, torch.tensor(-0.6057), rtol=1e-3)
    loss, _ = _run(nemo_cfg(**GSPO), data, CURR)
    torch.testing.assert_close(loss, expected)


def test_gspo_batch_size_2():
    # test_clipped_pg_loss_gspo_batch_size_2: row 1 (prev = -2) has ratio 2.4697, clipped to 1.2
    # where A > 0; mean of [[-0.9086, 0.9086, -1.8171], [-1.2, 2.4697, -2.4]] = -0.4912.
    adv = ADV.repeat(2, 1)
    prev = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    curr = CURR.repeat(2, 1)
    data = _fill(_data(batch_size=2), advantages=adv, prev_logprobs=prev)
    ratios = torch.exp((curr - prev).mean(-1, keepdim=True)).repeat(1, 3)
    expected = torch.max(-adv * ratios, -adv * ratios.clamp(0.8, 1.2)).mean()
    assert torch.allclose(expected, torch.tensor(-0.4912), rtol=1e-3)
    loss, _ = _run(nemo_cfg(**GSPO), data, curr)
    torch.testing.assert_close(loss, expected)


def test_gspo_importance_sampling_correction():
    # test_clipped_pg_loss_gspo_importance_sampling_correction: the sequence weight
    # exp(sum(prev - gen)) = 0.8187 scales [-0.9086, 0.9086, -1.8171]: mean -0.4959.
    cfg = nemo_cfg(**GSPO, use_importance_sampling_correction=True)
    data = _fill(_data(), advantages=ADV, prev_logprobs=PREV, generation_logprobs=GEN,
                 reference_policy_logprobs=torch.tensor([[-1.0, -1.0, -1.0]]))
    ratios = torch.exp((CURR - PREV).mean(-1, keepdim=True)).repeat(1, 3)
    weight = torch.exp((PREV - GEN).sum(-1, keepdim=True))
    expected = (weight * torch.max(-ADV * ratios, -ADV * ratios.clamp(0.8, 1.2))).mean()
    assert torch.allclose(expected, torch.tensor(-0.4959), rtol=1e-3)
    loss, _ = _run(cfg, data, CURR)
    torch.testing.assert_close(loss, expected, atol=1e-4, rtol=1e-3)


TOKEN_DIAGNOSTICS = ("probs_ratio", "probs_ratio_clamped", "token_mult_prob_error", "gen_kl_error",
                     "policy_kl_error", "js_divergence_error", "approx_entropy")


def test_metric_normalizations_default_config():
    # TestMetricNormalizationAdvertisement.test_default_grpo_config.
    norms = ClippedPGLossFn(nemo_cfg()).metric_normalizations
    assert norms["loss"] == norms["kl_penalty"] == norms["sampling_importance_ratio"] == "tokens"
    assert all(norms[key] == "tokens" for key in TOKEN_DIAGNOSTICS)
    for key in ("num_valid_samples", "positive_nll_loss", "probs_ratio_min", "probs_ratio_max"):
        assert norms[key] == "none", key
    assert "is_oob_ratio" not in norms  # not reported without truncated IS


def test_metric_normalizations_gspo():
    # TestMetricNormalizationAdvertisement.test_gspo_config_keys_on_sequence_flags.
    norms = ClippedPGLossFn(nemo_cfg(token_level_loss=False, sequence_level_importance_ratios=True,
                                     use_importance_sampling_correction=True)).metric_normalizations
    assert norms["loss"] == norms["kl_penalty"] == norms["sampling_importance_ratio"] == "sequences"
    assert norms["token_mult_prob_error"] == norms["probs_ratio"] == "tokens"


def test_metric_normalizations_seq_mask_tis_with_token_level_loss():
    # TestMetricNormalizationAdvertisement.test_seq_mask_tis_with_token_level_loss.
    norms = ClippedPGLossFn(nemo_cfg(use_importance_sampling_correction=True,
                                     truncated_importance_sampling_type="seq-mask-tis",
                                     truncated_importance_sampling_ratio=2.0,
                                     truncated_importance_sampling_ratio_min=0.5)).metric_normalizations
    assert norms["loss"] == "tokens" and norms["is_oob_ratio"] == "sequences"


def test_metric_normalizations_tis_with_sequence_level_loss():
    # TestMetricNormalizationAdvertisement.test_tis_under_sequence_level_loss_stays_tokens.
    norms = ClippedPGLossFn(nemo_cfg(token_level_loss=False, use_importance_sampling_correction=True,
                                     truncated_importance_sampling_type="tis",
                                     truncated_importance_sampling_ratio=2.0)).metric_normalizations
    assert norms["loss"] == "sequences" and norms["is_oob_ratio"] == "tokens"


def test_split_rescale_matches_sync_normalization():
    # test_split_rescale_matches_sync_normalization: two microbatches, called once with the true
    # global counts and once with counts of 1; dividing the summed raw metrics by the advertised
    # count gives the summed normalized ones. rel 1e-5, abs 1e-7, as NeMo RL.
    torch.manual_seed(1234)
    loss_fn = ClippedPGLossFn(nemo_cfg(use_importance_sampling_correction=True,
                                       truncated_importance_sampling_type="seq-mask-tis",
                                       truncated_importance_sampling_ratio=1.5,
                                       truncated_importance_sampling_ratio_min=0.7))
    microbatches = []
    for _ in range(2):
        data = _data(batch_size=4, seq_len=8)
        data["advantages"] = torch.randn(4, 8)
        data["prev_logprobs"] = -torch.rand(4, 8)
        data["generation_logprobs"] = -torch.rand(4, 8)
        data["reference_policy_logprobs"] = -torch.rand(4, 8)
        data["sample_mask"] = torch.tensor([1, 1, 1, 0])
        data["token_mask"][0, -2:] = 0
        microbatches.append((data, -torch.rand(4, 7)))
    seqs = sum(d["sample_mask"].sum() for d, _ in microbatches).float()
    toks = sum((d["token_mask"][:, 1:] * d["sample_mask"][:, None]).sum() for d, _ in microbatches).float()

    def summed(gvs, gvt):
        totals = {}
        for data, curr in microbatches:
            for key, value in loss_fn(_logits_for(curr), data, gvs, gvt)[1].items():
                totals[key] = totals.get(key, 0.0) + value.item()
        return totals

    synced, raw = summed(seqs, toks), summed(torch.tensor(1.0), torch.tensor(1.0))
    assert set(loss_fn.metric_normalizations) == set(synced)  # every metric is described
    for key, kind in loss_fn.metric_normalizations.items():
        if kind == "none":
            continue
        count = toks if kind == "tokens" else seqs
        assert raw[key] / count.item() == pytest.approx(synced[key], rel=1e-5, abs=1e-7), key
    assert raw["num_valid_samples"] == pytest.approx(synced["num_valid_samples"])
