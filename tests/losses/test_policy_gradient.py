"""ClippedPGLossFn against a loop reference, hand-worked clipping cases and config validation."""

import math

import loss_reference as ref
import pytest
import torch
from loss_data import global_counts, random_batch

from rmkit.losses import ClippedPGLossFn

BASE = {
    "reference_policy_kl_penalty": 0.05,
    "ratio_clip_min": 0.2,
    "ratio_clip_max": 0.2,
    "use_on_policy_kl_approximation": False,
    "use_importance_sampling_correction": False,
    "token_level_loss": True,
}

CONFIGS = {
    "ppo_token": {},
    "ppo_sequence": {"token_level_loss": False},
    "dapo_asymmetric": {"ratio_clip_min": 0.1, "ratio_clip_max": 0.28},
    "dual_clip": {"ratio_clip_c": 1.5, "ratio_clip_min": 0.05, "ratio_clip_max": 0.05},
    "reinforce": {"disable_ppo_ratio": True},
    "importance_sampling": {"use_importance_sampling_correction": True},
    "on_policy_kl": {"use_on_policy_kl_approximation": True, "reference_policy_kl_penalty": 0.5},
    "k1": {"reference_policy_kl_type": "k1", "reference_policy_kl_penalty": 0.5},
    "k2_sequence": {
        "reference_policy_kl_type": "k2",
        "token_level_loss": False,
        "reference_policy_kl_penalty": 1.0,
    },
    "clamps_hit": {
        "kl_input_clamp_value": 0.3,
        "kl_output_clamp_value": 0.02,
        "reference_policy_kl_penalty": 1.0,
    },
    "no_kl": {"reference_policy_kl_penalty": 0.0},
}


@pytest.mark.parametrize("seed,name", list(enumerate(sorted(CONFIGS))))
@pytest.mark.parametrize("per_seq_adv", [False, True])
def test_matches_loop_reference_values_and_gradients(seed, name, per_seq_adv):
    # float64 throughout; the only differences are summation order: 1e-10 relative on values and
    # gradients (observed ~1e-15).
    cfg = {**BASE, **CONFIGS[name]}
    logits, data = random_batch(per_seq_advantages=per_seq_adv, seed=seed)
    gvs, gvt = global_counts(data)
    loss, metrics = ClippedPGLossFn(cfg)(logits, data, gvs, gvt)
    want = ref.clipped_pg(logits, data, gvs, gvt, cfg)
    torch.testing.assert_close(loss, want, rtol=1e-10, atol=1e-14)
    (g,) = torch.autograd.grad(loss, logits, retain_graph=True)
    (g_want,) = torch.autograd.grad(want, logits)
    torch.testing.assert_close(g, g_want, rtol=1e-10, atol=1e-14)
    assert torch.all(g[1] == 0)  # row 1 has sample_mask 0
    assert math.isfinite(metrics["loss"]) and metrics["num_valid_samples"] == 3
    assert metrics["probs_ratio_min"] <= metrics["probs_ratio"] <= metrics["probs_ratio_max"]


def _one_token(ratio, advantage, **overrides):
    """Loss and logit gradient of one response token whose PPO ratio is `ratio`.

    Row: input_ids [0, 1], logits row 0 = [0, 0] so curr = log(1/2); prev = curr - log(ratio).
    """
    logits = torch.zeros(1, 2, 2, dtype=torch.float64, requires_grad=True)
    curr = math.log(0.5)
    data = {
        "input_ids": torch.tensor([[0, 1]]),
        "token_mask": torch.tensor([[0.0, 1.0]]),
        "sample_mask": torch.ones(1),
        "advantages": torch.tensor([[0.0, advantage]], dtype=torch.float64),
        "prev_logprobs": torch.tensor([[0.0, curr - math.log(ratio)]], dtype=torch.float64),
        "generation_logprobs": torch.tensor([[0.0, curr - math.log(ratio)]], dtype=torch.float64),
        "reference_policy_logprobs": torch.tensor([[0.0, curr]], dtype=torch.float64),
    }
    cfg = {**BASE, "reference_policy_kl_penalty": 0.0, **overrides}
    loss, metrics = ClippedPGLossFn(cfg)(logits, data, 1, 1)
    loss.backward()
    return loss.item(), logits.grad[0, 0, 1].item(), metrics


@pytest.mark.parametrize(
    "ratio,advantage,c,expected,clipped",
    [
        # A > 0, r = 1.5 > 1 + eps: max(-1.5, -1.2) = -1.2, the clipped branch: no gradient.
        (1.5, 1.0, None, -1.2, True),
        # A > 0, r = 0.5 < 1 - eps: max(-0.5, -0.8) = -0.5, unclipped: PPO does not clip improvements.
        (0.5, 1.0, None, -0.5, False),
        # A < 0, r = 0.5: max(0.5, 0.8) = 0.8, clipped: no gradient.
        (0.5, -1.0, None, 0.8, True),
        # A < 0, r = 1.5: max(1.5, 1.2) = 1.5, unclipped; dual clip c = 3 leaves it: min(1.5, 3) = 1.5.
        (1.5, -1.0, 3.0, 1.5, False),
        # A < 0, r = 4: max(4, 1.2) = 4 without dual clip (gradient flows) ...
        (4.0, -1.0, None, 4.0, False),
        # ... and with c = 3: min(4, -A * c = 3) = 3, a constant: no gradient.
        (4.0, -1.0, 3.0, 3.0, True),
        # A > 0 is never dual-clipped: r = 4 -> max(-4, -1.2) = -1.2 whatever c is.
        (4.0, 1.0, 3.0, -1.2, True),
    ],
)
def test_hand_worked_clipping_and_dual_clip(ratio, advantage, c, expected, clipped):
    loss, grad, metrics = _one_token(ratio, advantage, ratio_clip_c=c)
    assert loss == pytest.approx(expected, rel=1e-12)
    # Unclipped: d(-A * r)/d logit_1 = -A * r * d curr/d logit_1 = -A * r * (1 - 1/2).
    assert grad == pytest.approx(0.0 if clipped else -advantage * ratio * 0.5, abs=1e-12)
    assert metrics["probs_ratio"] == pytest.approx(ratio, rel=1e-12)
    assert metrics["probs_ratio_clamped"] == pytest.approx(min(max(ratio, 0.8), 1.2), rel=1e-12)


@pytest.mark.parametrize(
    "kind,expected",
    [("k1", -math.log(2)), ("k2", 0.5 * math.log(2) ** 2), ("k3", 1 - math.log(2))],
)
def test_kl_estimators_hand_values(kind, expected):
    # ref - curr = log 2: k1 = curr - ref = -log 2, k2 = (log 2)^2 / 2, k3 = 2 - log 2 - 1.
    logits = torch.zeros(1, 2, 2, dtype=torch.float64)
    curr = math.log(0.5)
    lp = torch.tensor([[0.0, curr]], dtype=torch.float64)
    data = {
        "input_ids": torch.tensor([[0, 1]]),
        "token_mask": torch.tensor([[0.0, 1.0]]),
        "sample_mask": torch.ones(1),
        "advantages": torch.zeros(1, 2, dtype=torch.float64),
        "prev_logprobs": lp,
        "generation_logprobs": lp,
        "reference_policy_logprobs": torch.tensor([[0.0, curr + math.log(2)]], dtype=torch.float64),
    }
    cfg = {**BASE, "reference_policy_kl_penalty": 2.0, "reference_policy_kl_type": kind}
    loss, metrics = ClippedPGLossFn(cfg)(logits, data, 1, 1)
    assert metrics["kl_penalty"] == pytest.approx(expected, rel=1e-12)
    assert loss.item() == pytest.approx(2.0 * expected, rel=1e-12)


def test_padding_with_inf_log_probs_stays_finite_in_float32():
    logits, data = random_batch(dtype=torch.float32)
    gvs, gvt = global_counts(data)
    loss, metrics = ClippedPGLossFn({**BASE, "use_importance_sampling_correction": True})(
        logits, data, gvs, gvt
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
    assert all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"ratio_clip_c": 1.0}, "ratio_clip_c.*> 1"),
        ({"ratio_clip_c": 0.5}, "ratio_clip_c.*> 1"),
        ({"reference_policy_kl_type": "k4"}, "unknown reference_policy_kl_type 'k4'"),
        ({"ratio_clip_min": -0.1}, "ratio_clip_min"),
        ({"ratio_clip_min": 1.5}, "ratio_clip_min"),
        ({"reference_policy_kl_penalty": -1.0}, "reference_policy_kl_penalty"),
        ({"kl_input_clamp_value": 0.0}, "kl_input_clamp_value"),
        ({"disable_ppo_ratio": True, "ratio_clip_c": 3.0}, "disable_ppo_ratio"),
        ({"ratio_clip": 0.2}, "unknown key.*ratio_clip"),
    ],
)
def test_invalid_configs_raise_clear_errors(overrides, match):
    with pytest.raises(ValueError, match=match):
        ClippedPGLossFn({**BASE, **overrides})


def test_missing_key_is_named():
    cfg = {k: v for k, v in BASE.items() if k != "token_level_loss"}
    with pytest.raises(ValueError, match="missing key.*token_level_loss"):
        ClippedPGLossFn(cfg)


def test_kl_needs_reference_logprobs():
    logits, data = random_batch()
    del data["reference_policy_logprobs"]
    gvs, gvt = global_counts(data)
    with pytest.raises(ValueError, match="reference_policy_logprobs"):
        ClippedPGLossFn(BASE)(logits, data, gvs, gvt)
    loss, metrics = ClippedPGLossFn({**BASE, "reference_policy_kl_penalty": 0.0})(logits, data, gvs, gvt)
    assert metrics["kl_penalty"] == 0.0 and torch.isfinite(loss)
