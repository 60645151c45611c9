"""NLLLoss and DPOLossFn against loop references and hand-derived values."""

import math

import loss_reference as ref
import pytest
import torch
from loss_data import global_counts, random_batch

from rmkit.losses import DPOLossFn, NLLLoss, next_token_logprobs

DPO_CFG = {
    "reference_policy_kl_penalty": 0.1,
    "preference_loss_weight": 1.0,
    "sft_loss_weight": 0.0,
    "preference_average_log_probs": False,
    "sft_average_log_probs": False,
}


def _grad(loss, x):
    return torch.autograd.grad(loss, x, retain_graph=True)[0]


def test_nll_matches_loop_reference():
    logits, data = random_batch()
    gvs, gvt = global_counts(data)
    loss, metrics = NLLLoss()(logits, data, gvs, gvt)
    want = ref.nll(logits, data, gvt)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=0)
    torch.testing.assert_close(_grad(loss, logits), _grad(want, logits), rtol=1e-10, atol=1e-14)
    assert metrics["num_unmasked_tokens"] == gvt.item()


@pytest.mark.parametrize("average", [False, True])
def test_nll_dpo_form_is_per_sample(average):
    logits, data = random_batch()
    loss, _ = NLLLoss()(logits, data, None, None, dpo_loss=True, dpo_average_log_probs=average)
    assert loss.shape == (4,)
    for b in range(4):
        want = ref.sequence_nll(logits, data, b, average)
        torch.testing.assert_close(loss[b], want, rtol=1e-12, atol=0)


def test_dpo_policy_equal_to_reference_gives_ln2():
    # Implicit rewards are 0 for both rows: -logsigmoid(0) = ln 2, accuracy 0 (a tie is wrong).
    logits, data = random_batch(batch=4)
    with torch.no_grad():
        lp = next_token_logprobs(logits, data["input_ids"])  # bit-identical: rewards exactly 0
    data["reference_policy_logprobs"] = torch.cat([torch.zeros(4, 1, dtype=lp.dtype), lp], 1)
    data["sample_mask"] = torch.ones(4)
    loss, metrics = DPOLossFn(DPO_CFG)(logits, data, 4, None)
    assert loss.item() == pytest.approx(math.log(2), rel=1e-12)
    assert metrics["accuracy"] == 0.0
    assert metrics["rewards_chosen_mean"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"preference_average_log_probs": True},
        {"sft_loss_weight": 0.5, "preference_loss_weight": 2.0},
        {"sft_loss_weight": 1.0, "sft_average_log_probs": True, "preference_average_log_probs": True},
    ],
)
def test_dpo_matches_loop_reference(overrides):
    cfg = {**DPO_CFG, **overrides}
    logits, data = random_batch(batch=6, seed=3)
    data["sample_mask"] = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    gvs, _ = global_counts(data)
    loss, metrics = DPOLossFn(cfg)(logits, data, gvs, None)
    want = ref.dpo(logits, data, gvs, cfg)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=0)
    torch.testing.assert_close(_grad(loss, logits), _grad(want, logits), rtol=1e-10, atol=1e-14)
    assert metrics["num_valid_samples"] == 2
    w_p, w_s = cfg["preference_loss_weight"], cfg["sft_loss_weight"]
    assert metrics["loss"] == pytest.approx(w_p * metrics["preference_loss"] + w_s * metrics["sft_loss"])


def test_dpo_config_errors_name_the_key():
    with pytest.raises(ValueError, match="missing key.*sft_loss_weight"):
        DPOLossFn({k: v for k, v in DPO_CFG.items() if k != "sft_loss_weight"})
    with pytest.raises(ValueError, match="unknown key.*beta"):
        DPOLossFn({**DPO_CFG, "beta": 0.1})
