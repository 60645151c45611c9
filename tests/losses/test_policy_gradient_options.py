"""ClippedPGLossFn's NeMo RL options: hand-derived values, config checks, invariants, no host syncs.

Hand values are in float64 (1e-12 relative). One response token per row unless stated: input_ids
[0, 1], logits [0, 0] at position 0, so curr = log(1/2) and d curr / d logit_1 = 1/2.
"""

import math

import pytest
import torch
from loss_data import global_counts, random_batch, split_batch

from rmkit.losses import ClippedPGLossFn, SequencePackingLossWrapper

BASE = {
    "reference_policy_kl_penalty": 0.0,
    "ratio_clip_min": 0.2,
    "ratio_clip_max": 0.2,
    "use_on_policy_kl_approximation": False,
    "use_importance_sampling_correction": False,
    "token_level_loss": True,
}
HALF = math.log(0.5)
IS = {"use_importance_sampling_correction": True}


def _rows(prev, gen, adv=0.0, ref=None, rewards=None):
    """Logits `[B, 2, 2]` (a leaf) and data of B one-token rows; per-row lists `prev`, `gen`."""
    rows = len(prev)
    column = lambda values: torch.tensor([[0.0, v] for v in values], dtype=torch.float64)  # noqa: E731
    data = {
        "input_ids": torch.tensor([[0, 1]] * rows),
        "token_mask": torch.tensor([[0.0, 1.0]] * rows),
        "sample_mask": torch.ones(rows),
        "advantages": column([adv] * rows),
        "prev_logprobs": column(prev),
        "generation_logprobs": column(gen),
        "reference_policy_logprobs": column(ref if ref is not None else [HALF] * rows),
    }
    if rewards is not None:
        data["rewards"] = torch.tensor(rewards, dtype=torch.float64)
    return torch.zeros(rows, 2, 2, dtype=torch.float64, requires_grad=True), data


def _call(cfg, logits, data):
    return ClippedPGLossFn({**BASE, **cfg})(logits, data, *global_counts(data))


def test_mismatch_metrics_hand_values():
    # prev = log 1/2, gen = log 1/4: weight exp(prev - gen) = 2; k3 of prev - gen = log 2 is
    # 2 - 1 - log 2, of gen - prev is 1/2 - 1 + log 2; the mixture M = 3/8 gives
    # JS = (k3(log 4/3) + k3(log 2/3)) / 2 = -(log 4/3 + log 2/3) / 2 = log(9/8) / 2.
    logits, data = _rows(prev=[HALF], gen=[math.log(0.25)])
    _, m = _call({}, logits, data)
    assert m["token_mult_prob_error"].item() == pytest.approx(2.0, rel=1e-12)
    assert m["sampling_importance_ratio"].item() == pytest.approx(2.0, rel=1e-12)
    assert m["gen_kl_error"].item() == pytest.approx(1 - math.log(2), rel=1e-12)
    assert m["policy_kl_error"].item() == pytest.approx(math.log(2) - 0.5, rel=1e-12)
    assert m["js_divergence_error"].item() == pytest.approx(math.log(9 / 8) / 2, rel=1e-12)
    assert m["positive_nll_loss"].item() == 0.0 and "is_oob_ratio" not in m


def test_ratio_extrema():
    # Ratios 1/2 and 3/2 (prev = curr - log r): clamped 0.8 and 1.2.
    logits, data = _rows(prev=[HALF - math.log(0.5), HALF - math.log(1.5)], gen=[HALF, HALF])
    _, m = _call({}, logits, data)
    assert [m[k].item() for k in ("probs_ratio_min", "probs_ratio_max")] == pytest.approx([0.5, 1.5], rel=1e-12)
    got = [m[k].item() for k in ("probs_ratio_clamped_min", "probs_ratio_clamped_max")]
    assert got == pytest.approx([0.8, 1.2], rel=1e-12)


@pytest.mark.parametrize("use_cispo,curr_grad", [(False, 0.0), (True, -1.2)])
def test_cispo_gradient_flows_through_curr_only(use_cispo, curr_grad):
    # A = 1, ratio 3/2: PPO takes the clipped branch -A * 1.2 (no gradient); CISPO's
    # -A * sg(1.2) * curr has gradient -1.2 with respect to curr, whatever the clip.
    logits, data = _rows(prev=[HALF - math.log(1.5)], gen=[HALF], adv=1.0)
    loss, _ = _call({"use_cispo": use_cispo}, logits, data)
    loss.backward()
    assert loss.item() == pytest.approx(-1.2 * (HALF if use_cispo else 1.0), rel=1e-12)
    assert logits.grad[0, 0, 1].item() == pytest.approx(curr_grad * 0.5, rel=1e-12, abs=1e-15)


def test_positive_example_nll():
    # Rows with rewards [1, 0, 2]: rows 0 and 2 count, each NLL -log 1/2 = log 2 -> mean log 2;
    # A = 0 and beta = 0, so loss = 0.1 * log 2; its gradient on row 1 is 0.
    logits, data = _rows(prev=[HALF] * 3, gen=[HALF] * 3, rewards=[1.0, 0.0, 2.0])
    loss, m = _call({"positive_example_nll_weight": 0.1}, logits, data)
    loss.backward()
    assert m["positive_nll_loss"].item() == pytest.approx(math.log(2), rel=1e-12)
    assert loss.item() == pytest.approx(0.1 * math.log(2), rel=1e-12)
    # d/d logit_1 of 0.1 * (-curr) / 2 tokens = -0.1 * 0.5 / 2.
    assert logits.grad[:, 0, 1].tolist() == pytest.approx([-0.025, 0.0, -0.025], rel=1e-12, abs=1e-15)


def test_positive_example_nll_without_positive_rows_is_zero_and_needs_rewards():
    logits, data = _rows(prev=[HALF], gen=[HALF], rewards=[0.0])
    loss, m = _call({"positive_example_nll_weight": 0.1}, logits, data)
    assert loss.item() == 0.0 and m["positive_nll_loss"].item() == 0.0
    del data["rewards"]
    with pytest.raises(ValueError, match="rewards"):
        _call({"positive_example_nll_weight": 0.1}, logits, data)


def test_kl_in_reward_leaves_the_kl_out_of_the_loss():
    # ref - curr = log 2: k3 = 1 - log 2, reported in kl_penalty either way; the loss has it only
    # without use_kl_in_reward. Without reference log-probs the KL-in-reward loss still runs.
    logits, data = _rows(prev=[HALF], gen=[HALF], ref=[0.0])
    loss, m = _call({"reference_policy_kl_penalty": 0.5}, logits, data)
    assert loss.item() == pytest.approx(0.5 * (1 - math.log(2)), rel=1e-12)
    loss, m = _call({"reference_policy_kl_penalty": 0.5, "use_kl_in_reward": True}, logits, data)
    assert loss.item() == 0.0 and m["kl_penalty"].item() == pytest.approx(1 - math.log(2), rel=1e-12)
    del data["reference_policy_logprobs"]
    _call({"reference_policy_kl_penalty": 0.5, "use_kl_in_reward": True}, logits, data)


def test_seq_mask_tis_masks_whole_sequences():
    # Two 1-token rows with weights 2 and 1.01, bounds [0.99, 1.02]: row 0 is dropped.
    # is_oob_ratio = 1 of 2 sequences; A = -1: loss = (0 + 1.01 * 1) / 2 tokens.
    cfg = {**IS, "truncated_importance_sampling_type": "seq-mask-tis",
           "truncated_importance_sampling_ratio": 1.02, "truncated_importance_sampling_ratio_min": 0.99}
    logits, data = _rows(prev=[HALF, HALF], gen=[HALF - math.log(2), HALF - math.log(1.01)], adv=-1.0)
    loss, m = _call(cfg, logits, data)
    assert m["is_oob_ratio"].item() == pytest.approx(0.5, rel=1e-12)
    assert loss.item() == pytest.approx(1.01 / 2, rel=1e-12)
    assert m["sampling_importance_ratio"].item() == pytest.approx(1.01 / 2, rel=1e-12)


def test_seq_mask_tis_ignores_an_infinite_log_ratio_in_the_geometric_mean():
    # Row of 3 tokens, prev - gen = [0.0005, 0.0005, +inf]: the infinite one counts as 0 in the
    # mean (geometric mean exp(0.001 / 3), kept), and its own weight exp(inf) becomes 0. A = -1.
    cfg = {**IS, "truncated_importance_sampling_type": "seq-mask-tis",
           "truncated_importance_sampling_ratio": 1.002, "truncated_importance_sampling_ratio_min": 0.999}
    logits = torch.zeros(1, 4, 2, dtype=torch.float64, requires_grad=True)
    half = torch.full((1, 4), HALF, dtype=torch.float64)
    gen = half - 0.0005
    gen[0, 3] = float("-inf")
    data = {"input_ids": torch.zeros(1, 4, dtype=torch.long), "token_mask": torch.tensor([[0.0, 1, 1, 1]]),
            "sample_mask": torch.ones(1), "advantages": -torch.ones(1, 4, dtype=torch.float64),
            "prev_logprobs": half, "generation_logprobs": gen, "reference_policy_logprobs": half}
    loss, m = _call(cfg, logits, data)
    assert m["is_oob_ratio"].item() == 0.0
    assert loss.item() == pytest.approx(2 * math.exp(0.0005) / 3, rel=1e-12)


def test_gspo_sampling_importance_ratio_is_a_mean_over_sequences():
    # Sequence weights 2 and 1/2 -> (2 + 1/2) / 2 sequences. (NeMo RL multiplies the [B, 1] weights
    # by the [B] sample mask, which broadcasts to [B, B] and reports (2 + 1/2) * 2 / 2 here.)
    cfg = {**IS, "sequence_level_importance_ratios": True, "token_level_loss": False}
    logits, data = _rows(prev=[HALF, HALF], gen=[HALF - math.log(2), HALF + math.log(2)])
    _, m = _call(cfg, logits, data)
    assert m["sampling_importance_ratio"].item() == pytest.approx(1.25, rel=1e-12)


TIS = {**IS, "truncated_importance_sampling_type": "tis", "truncated_importance_sampling_ratio": 2.0}


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"sequence_level_importance_ratios": True}, "sequence_level_importance_ratios.*token_level_loss False"),
        ({"use_cispo": True, "token_level_loss": False}, "use_cispo needs token_level_loss True"),
        ({"truncated_importance_sampling_type": "tis", "truncated_importance_sampling_ratio": 2.0},
         "truncated_importance_sampling_type needs use_importance_sampling_correction"),
        ({**TIS, "truncated_importance_sampling_type": "clip"}, "unknown truncated_importance_sampling_type 'clip'"),
        ({**TIS, "truncated_importance_sampling_ratio": None}, "truncated_importance_sampling_ratio must be set"),
        ({**TIS, "truncated_importance_sampling_ratio": 0.0}, "truncated_importance_sampling_ratio must be set"),
        ({**TIS, "truncated_importance_sampling_type": "icepop"}, "'icepop' needs truncated_importance_sampling_ratio_min"),
        ({**TIS, "truncated_importance_sampling_type": "seq-mask-tis", "truncated_importance_sampling_ratio_min": 0.5,
          "sequence_level_importance_ratios": True, "token_level_loss": False},
         "seq-mask-tis.*incompatible with sequence_level_importance_ratios"),
        ({"truncated_importance_sampling_ratio": 2.0}, "truncated_importance_sampling_type is None"),
        ({"positive_example_nll_weight": -0.1}, "positive_example_nll_weight must be >= 0"),
    ],
)
def test_invalid_option_combinations_name_the_key(overrides, match):
    with pytest.raises(ValueError, match=match):
        ClippedPGLossFn({**BASE, **overrides})


INVARIANT_CONFIGS = {
    "gspo_tis": {**TIS, "truncated_importance_sampling_ratio": 1.5, "sequence_level_importance_ratios": True,
                 "token_level_loss": False},
    "cispo_icepop": {**IS, "use_cispo": True, "truncated_importance_sampling_type": "icepop",
                     "truncated_importance_sampling_ratio": 1.3, "truncated_importance_sampling_ratio_min": 0.7},
    "seq_mask_tis_on_policy_kl": {**IS, "truncated_importance_sampling_type": "seq-mask-tis",
                                  "truncated_importance_sampling_ratio": 1.1,
                                  "truncated_importance_sampling_ratio_min": 0.95,
                                  "use_on_policy_kl_approximation": True, "reference_policy_kl_penalty": 0.1},
    "force_on_policy": {**TIS, "force_on_policy_ratio": True, "reference_policy_kl_penalty": 0.1},
}


@pytest.mark.parametrize("name", sorted(INVARIANT_CONFIGS))
def test_microbatches_and_packing_give_the_full_batch(name):
    # float64; summation order only: 1e-10 relative. Metrics: additive ones sum, extrema reduce.
    loss_fn = ClippedPGLossFn({**BASE, **INVARIANT_CONFIGS[name]})
    logits, data = random_batch(batch=4, seq=6, seed=7)
    gvs, gvt = global_counts(data)
    want, want_metrics = loss_fn(logits, data, gvs, gvt)
    (want_grad,) = torch.autograd.grad(want, logits)
    total = 0.0
    for rows in (slice(0, 2), slice(2, 4)):
        loss, _ = loss_fn(logits[rows], split_batch(data, rows), gvs, gvt)
        total = total + loss
    (grad,) = torch.autograd.grad(total, logits)
    torch.testing.assert_close(total, want, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-14)

    packed = {k: v if v.dim() == 1 else v.reshape(1, 24, *v.shape[2:]) for k, v in data.items()}
    wrapper = SequencePackingLossWrapper(loss_fn, torch.tensor([0, 6, 12, 18, 24]))
    loss, metrics = wrapper(logits.reshape(1, 24, -1), packed, gvs, gvt)
    (grad,) = torch.autograd.grad(loss, logits)
    torch.testing.assert_close(loss, want, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-14)
    assert metrics.keys() == want_metrics.keys()
    for key, value in want_metrics.items():
        assert metrics[key].item() == pytest.approx(value.item(), rel=1e-10, abs=1e-14), key


def _no_host_reads(*args, **kwargs):
    raise AssertionError("the loss read a tensor on the host")


@pytest.mark.parametrize("name", sorted(INVARIANT_CONFIGS))
def test_no_host_reads_in_the_loss(name, monkeypatch):
    # A host read (.item(), bool(t), float(t), .tolist()) would synchronize with the device on every
    # microbatch; with these patched to fail, the loss and its backward must still run.
    loss_fn = ClippedPGLossFn({**BASE, **INVARIANT_CONFIGS[name], "positive_example_nll_weight": 0.1})
    logits, data = random_batch(batch=4, seq=6, seed=7)
    data["rewards"] = torch.tensor([1.0, 0.0, 1.0, -1.0])
    counts = global_counts(data)
    for method in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__"):
        monkeypatch.setattr(torch.Tensor, method, _no_host_reads)
    loss, _ = loss_fn(logits, data, *counts)
    loss.backward()
    monkeypatch.undo()
    assert torch.isfinite(logits.grad).all()
