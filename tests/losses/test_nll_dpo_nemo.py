"""NeMo RL's NLL, DPO and masked_mean unit tests, re-created against rmkit
(tests/unit/algorithms/test_loss_functions.py).

Inputs, configs and expected values are NeMo RL's; only the call differs. NeMo RL turns the logits
into log-probs before its loss (`prepare_loss_input`); rmkit's losses take the logits, so these
tests hand them the logits NeMo RL starts from. NeMo RL's DPO data holds the reference log-probs
rolled left by one, rmkit's are aligned with input_ids; every test here uses zero (or, with the
preference term off, unused) reference log-probs, where the two agree. Float32 as in NeMo RL, with
torch's float32 tolerances (rtol 1.3e-6, atol 1e-5) unless a test says otherwise. NeMo RL skips these
without a GPU; here they run on the CPU, and the random ones are seeded.
"""

import math

import torch

from rmkit.losses import DPOLossFn, NLLLoss, masked_mean


def _dpo(beta, preference_weight, sft_weight, average=False):
    return DPOLossFn(
        {
            "reference_policy_kl_penalty": beta,
            "preference_loss_weight": preference_weight,
            "sft_loss_weight": sft_weight,
            "preference_average_log_probs": average,
            "sft_average_log_probs": average,
        }
    )


def _nemo_counts(data):
    """NeMo RL's tests count global_valid_toks over the whole token_mask, position 0 included."""
    return data["sample_mask"].sum(), (data["token_mask"] * data["sample_mask"][:, None]).sum()


def _one_hot_logits(targets, vocab=8, value=999.0):
    """Logits `[1, len(targets), vocab]`: `value` at each target index, 0 elsewhere (None: all 0)."""
    logits = torch.zeros(1, len(targets), vocab)
    for t, target in enumerate(targets):
        if target is not None:
            logits[0, t, target] = value
    return logits


def test_nll_loss():
    # test_nll_loss: tokens 0..3, the loss trains on tokens 2 and 3 (predicted at positions 1, 2).
    data = {
        "input_ids": torch.arange(4)[None],
        "token_mask": torch.tensor([[0, 0, 1, 1]]),
        "sample_mask": torch.tensor([1]),
    }
    # Right tokens at logit 999: each log-prob is 0, so the loss is 0.
    loss, metrics = NLLLoss()(_one_hot_logits([1, 2, 3, None]), data, *_nemo_counts(data))
    torch.testing.assert_close(loss, torch.tensor(0.0))
    assert metrics["num_unmasked_tokens"] == 2
    # Wrong tokens at 999: each trained token costs 999; the mean over the 2 tokens is 999.
    loss, metrics = NLLLoss()(_one_hot_logits([0, 1, 2, None]), data, *_nemo_counts(data))
    torch.testing.assert_close(loss, torch.tensor(999.0))
    assert metrics["num_unmasked_tokens"] == 2


def _nemo_dpo_batch(vocab=16):
    """setup_dpo_loss_test_data: one pair (rows 0..3 and 4..7), trained on the last two tokens, zero logits."""
    data = {
        "input_ids": torch.arange(8).reshape(2, 4),
        "token_mask": torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1]]),
        "sample_mask": torch.tensor([1, 1]),
        "reference_policy_logprobs": torch.zeros(2, 4),
    }
    return data, torch.zeros(2, 4, vocab)


def test_dpo_loss():
    # test_dpo_loss. Chosen and rejected have the same log-probs: preference loss -logsigmoid(0) = ln 2.
    data, logits = _nemo_dpo_batch()
    loss, _ = _dpo(0.0, 1.0, 0.0)(logits, data, *_nemo_counts(data))
    assert torch.isclose(loss, -torch.nn.functional.logsigmoid(torch.tensor(0.0)))
    # With sft_loss_weight 0.5: the chosen row's 2 tokens each cost ln 16 under uniform logits.
    loss, _ = _dpo(0.0, 1.0, 0.5)(logits, data, *_nemo_counts(data))
    expected_sft = -torch.log_softmax(torch.zeros(1, 16), -1)[:, 0].sum() * 2 * 1
    expected = 0.5 * expected_sft + -torch.nn.functional.logsigmoid(torch.tensor(0.0))
    assert torch.isclose(loss, expected)
    assert math.isclose(expected.item(), math.log(16) + math.log(2), rel_tol=1e-6)


def test_dpo_loss_varying_sequence_lengths():
    # test_dpo_loss_varying_sequence_lengths: 2 pairs of lengths [3, 5] and [4, 6], vocab 10, zero
    # logits (every token log-prob -ln 10). The SFT term is the chosen rows' NLL, summed per row and
    # averaged over pairs ((2 + 3) ln 10 / 2), or with *_average_log_probs averaged per token (ln 10).
    lengths, vocab = [3, 5, 4, 6], 10
    input_ids = torch.zeros(4, 6, dtype=torch.long)
    token_mask = torch.zeros(4, 6)
    for row, length in enumerate(lengths):
        input_ids[row, :length] = torch.arange(length)
        token_mask[row, :length] = 1.0
    data = {
        "input_ids": input_ids,
        "reference_policy_logprobs": torch.zeros(4, 6),
        "token_mask": token_mask,
        "sample_mask": torch.ones(4),
    }
    logits = torch.zeros(4, 6, vocab)
    _, metrics = _dpo(0.1, 1.0, 0.5)(logits, data, *_nemo_counts(data))
    _, metrics_avg = _dpo(0.1, 1.0, 0.5, average=True)(logits, data, *_nemo_counts(data))

    token_logprobs = torch.log_softmax(logits[:, 1:], -1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    per_token_sft = -(token_logprobs[::2] * token_mask[:, 1:][::2])
    expected_no_avg = per_token_sft.sum(-1).mean()
    expected_avg = per_token_sft.sum() / token_mask[:, 1:][::2].sum()
    assert torch.isclose(metrics["sft_loss"], expected_no_avg)
    assert torch.isclose(metrics_avg["sft_loss"], expected_avg)
    assert math.isclose(expected_no_avg.item(), 2.5 * math.log(10), rel_tol=1e-6)


def test_dpo_sft_matches_nll_loss():
    # test_dpo_sft_matches_nll_loss: with preference_loss_weight 0, DPO is the chosen rows' summed NLL
    # averaged over pairs; times pairs / NLL's token count it equals NLLLoss on the chosen rows.
    g = torch.Generator().manual_seed(0)
    vocab = 8
    dpo_data = {
        "input_ids": torch.randint(0, vocab, (4, 5), generator=g),
        "token_mask": torch.tensor([[0, 0, 1, 1, 0], [0, 0, 1, 1, 1], [0, 1, 1, 1, 1], [0, 1, 1, 1, 0]]),
        "sample_mask": torch.tensor([1, 1, 1, 1]),
        "reference_policy_logprobs": torch.randn(4, 5, generator=g),
    }
    sft_data = {key: dpo_data[key][::2] for key in ("input_ids", "token_mask", "sample_mask")}
    logits = torch.randn(4, 5, vocab, generator=g)

    # NeMo RL's count, kept as it is: sample_mask[:, None] * (all chosen token_mask entries) = 2 * 6.
    nll_toks = (sft_data["sample_mask"][:, None] * sft_data["token_mask"].sum()).sum()
    nll_loss, _ = NLLLoss()(logits[::2], sft_data, None, nll_toks)
    dpo_loss, _ = _dpo(0.0, 0.0, 1.0)(logits, dpo_data, *_nemo_counts(dpo_data))

    scaled_dpo_loss = dpo_loss * sft_data["sample_mask"].sum() / nll_toks
    torch.testing.assert_close(scaled_dpo_loss, nll_loss)


def test_masked_mean_all_zeros():
    # test_masked_mean_all_zeros: an all-zero mask gives 0 (not NaN), whole-tensor and per row.
    values = torch.tensor([1.0, 2.0, 3.0, 4.0])
    mask = torch.zeros_like(values)
    torch.testing.assert_close(masked_mean(values, mask), torch.tensor(0.0))
    mask[0] = 1
    torch.testing.assert_close(masked_mean(values, mask), torch.tensor(1.0))
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    torch.testing.assert_close(masked_mean(values, torch.zeros_like(values), dim=1), torch.tensor([0.0, 0.0]))


def test_nll_loss_advertises_counts_as_none():
    # TestMetricNormalizationAdvertisement.test_nll_loss_advertises_counts_as_none (NeMo RL's enum
    # values are these strings).
    norms = NLLLoss().metric_normalizations
    assert norms["loss"] == "tokens"
    assert norms["num_unmasked_tokens"] == "none"
    assert norms["num_valid_samples"] == "none"


def test_nll_metric_normalizations_match_the_division():
    # rmkit: the advertised normalizations describe what the loss does. Halving the batch's token
    # count doubles "tokens" metrics and leaves "none" ones alone.
    data = {
        "input_ids": torch.arange(4)[None],
        "token_mask": torch.tensor([[0, 0, 1, 1]]),
        "sample_mask": torch.tensor([1]),
    }
    logits = _one_hot_logits([0, 1, 2, None])
    loss_fn = NLLLoss()
    _, full = loss_fn(logits, data, 1, 2)
    _, half = loss_fn(logits, data, 1, 1)
    assert set(loss_fn.metric_normalizations) == set(full)
    for key, kind in loss_fn.metric_normalizations.items():
        factor = 2.0 if kind == "tokens" else 1.0
        torch.testing.assert_close(half[key], full[key] * factor, msg=key)
