"""ClippedPGLossFn against a loop reference, hand-worked clipping cases and config validation.

NeMo RL's own unit tests, re-created, are in test_policy_gradient_nemo.py.
"""

import math

import pytest
import torch
from loss_data import global_counts, random_batch
from loss_reference import token_logprob

from rmkit.losses import ClippedPGLossFn, aligned_logprobs

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
    "input_clamp_on_policy": {  # the input clamp must stop the on-policy weight's gradient too
        "use_on_policy_kl_approximation": True,
        "kl_input_clamp_value": 0.3,
        "kl_output_clamp_value": None,
        "reference_policy_kl_penalty": 1.0,
    },
    "no_kl": {"reference_policy_kl_penalty": 0.0},
    "gspo": {"sequence_level_importance_ratios": True, "token_level_loss": False},
    "gspo_importance_sampling": {
        "sequence_level_importance_ratios": True,
        "token_level_loss": False,
        "use_importance_sampling_correction": True,
    },
    "cispo": {"use_cispo": True, "use_importance_sampling_correction": True},
    "force_on_policy": {"force_on_policy_ratio": True, "use_importance_sampling_correction": True},
    "force_on_policy_reinforce": {"force_on_policy_ratio": True, "disable_ppo_ratio": True},
    "tis": {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "tis",
        "truncated_importance_sampling_ratio": 1.2,
        "truncated_importance_sampling_ratio_min": 0.8,
    },
    "tis_gspo": {
        "sequence_level_importance_ratios": True,
        "token_level_loss": False,
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "tis",
        "truncated_importance_sampling_ratio": 1.5,
    },
    "icepop": {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "icepop",
        "truncated_importance_sampling_ratio": 1.3,
        "truncated_importance_sampling_ratio_min": 0.7,
    },
    "seq_mask_tis": {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "seq-mask-tis",
        "truncated_importance_sampling_ratio": 1.1,
        "truncated_importance_sampling_ratio_min": 0.95,
    },
    "kl_in_reward": {"use_kl_in_reward": True, "reference_policy_kl_penalty": 0.5},
    "positive_nll": {"positive_example_nll_weight": 0.3},
}


def _kl_token(curr, gen, ref_lp, cfg):
    """Weighted, clamped KL estimate of one token (a scalar tensor), as NeMo RL's calculate_kl."""
    log_ratio = ref_lp - curr
    weight = torch.exp(curr - gen) if cfg["use_on_policy_kl_approximation"] else torch.exp(curr - curr.detach())
    bound = cfg.get("kl_input_clamp_value", 20.0)
    if bound is not None and abs(log_ratio.item()) > bound:
        # The clamped input is a constant, and the weight is detached with it: no gradient at all.
        log_ratio = torch.tensor(math.copysign(bound, log_ratio.item()), dtype=torch.float64)
        weight = weight.detach()
    kind = cfg.get("reference_policy_kl_type", "k3")
    if kind == "k1":
        k = -log_ratio
    elif kind == "k2":
        k = log_ratio**2 / 2
    else:
        k = torch.exp(log_ratio) - 1 - log_ratio
    kl = weight * k
    out = cfg.get("kl_output_clamp_value", 10.0)
    if out is not None and abs(kl.item()) > out:
        kl = torch.tensor(math.copysign(out, kl.item()), dtype=torch.float64)
    return kl


def _finite(x):
    return x if math.isfinite(x) else 0.0


def _actor_weights(prev, gen, cfg):
    """The actor's importance weights of one row's tokens (lists of floats), truncated per cfg."""
    diffs = [p - g for p, g in zip(prev, gen)]
    if cfg.get("sequence_level_importance_ratios"):
        weights = [_finite(math.exp(sum(diffs)))] * len(diffs)
    else:
        weights = [_finite(math.exp(d)) for d in diffs]
    kind = cfg.get("truncated_importance_sampling_type")
    high, low = cfg.get("truncated_importance_sampling_ratio"), cfg.get("truncated_importance_sampling_ratio_min")
    if kind == "tis":
        weights = [min(max(w, low or 0.0), high) for w in weights]
    elif kind == "icepop":
        weights = [w if low <= w <= high else 0.0 for w in weights]
    elif kind == "seq-mask-tis":
        geo_mean = math.exp(sum(_finite(d) for d in diffs) / len(diffs))
        weights = weights if low <= geo_mean <= high else [0.0] * len(weights)
    return weights


def _actor_row(curr, prev, gen, adv, cfg):
    """Per-token actor terms of one row: `curr` a list of scalar tensors, the rest lists of floats."""
    if cfg.get("force_on_policy_ratio"):
        prev = [c.item() for c in curr]
        ratios = [torch.exp(c - c.detach()) for c in curr]
    elif cfg.get("sequence_level_importance_ratios"):
        ratios = [torch.exp(sum(c - p for c, p in zip(curr, prev)) / len(curr))] * len(curr)
    else:
        ratios = [torch.exp(c - p) for c, p in zip(curr, prev)]
    weights = _actor_weights(prev, gen, cfg)
    terms = []
    for c, r, a, w in zip(curr, ratios, adv, weights):
        clipped = r if cfg.get("force_on_policy_ratio") else torch.clamp(
            r, 1 - cfg["ratio_clip_min"], 1 + cfg["ratio_clip_max"])
        if cfg.get("use_cispo"):
            term = -a * clipped.detach() * c
        elif cfg.get("disable_ppo_ratio") and not cfg.get("force_on_policy_ratio"):
            term = -a * c
        else:
            term = torch.maximum(-a * r, -a * clipped)
            if cfg.get("ratio_clip_c") is not None and a < 0:
                term = torch.minimum(term, torch.tensor(-a * cfg["ratio_clip_c"], dtype=torch.float64))
        terms.append(term * w if cfg["use_importance_sampling_correction"] else term)
    return terms


def reference_loss(logits, data, gvs, gvt, cfg):
    """The loss as a Python loop over rows and tokens, in float64."""
    actor_total = kl_total = nll_total = torch.zeros((), dtype=torch.float64)
    nll_count = 0
    for b in range(logits.shape[0]):
        tokens = [t for t in range(1, logits.shape[1]) if data["token_mask"][b, t]]
        if not data["sample_mask"][b] or not tokens:
            continue
        curr = [token_logprob(logits[b, t - 1], int(data["input_ids"][b, t])) for t in tokens]
        per_seq_adv = data["advantages"].dim() == 1
        adv = [float(data["advantages"][b] if per_seq_adv else data["advantages"][b, t]) for t in tokens]
        prev = [float(data["prev_logprobs"][b, t]) for t in tokens]
        gen = [float(data["generation_logprobs"][b, t]) for t in tokens]
        actor = sum(_actor_row(curr, prev, gen, adv, cfg))
        kl_curr = curr
        if "curr_logprobs_unfiltered" in data:
            kl_curr = [data["curr_logprobs_unfiltered"][b, t] for t in tokens]
        kl = sum(_kl_token(c, g, float(data["reference_policy_logprobs"][b, t]), cfg)
                 for c, g, t in zip(kl_curr, gen, tokens))
        if "rewards" in data and data["rewards"][b] > 0:
            nll_total, nll_count = nll_total - sum(curr), nll_count + len(tokens)
        if cfg["token_level_loss"]:
            actor_total, kl_total = actor_total + actor / gvt, kl_total + kl / gvt
        else:
            actor_total, kl_total = actor_total + actor / len(tokens) / gvs, kl_total + kl / len(tokens) / gvs
    beta = 0.0 if cfg.get("use_kl_in_reward") else cfg["reference_policy_kl_penalty"]
    nll = nll_total / nll_count if nll_count else nll_total
    return actor_total + beta * kl_total + cfg.get("positive_example_nll_weight", 0.0) * nll



def assert_matches_reference(logits, data, cfg):
    """`(loss, metrics, grad)` of ClippedPGLossFn, after checking the loss and its gradient against
    `reference_loss` within rtol 1e-10 (float64 inputs: rounding is ~1e-15)."""
    gvs, gvt = global_counts(data)
    loss, metrics = ClippedPGLossFn(cfg)(logits, data, gvs, gvt)
    want = reference_loss(logits, data, gvs, gvt, cfg)
    torch.testing.assert_close(loss, want, rtol=1e-10, atol=1e-14)
    (g,) = torch.autograd.grad(loss, logits, retain_graph=True)
    (g_want,) = torch.autograd.grad(want, logits)
    torch.testing.assert_close(g, g_want, rtol=1e-10, atol=1e-14)
    return loss, metrics, g


@pytest.mark.parametrize("seed,name", list(enumerate(sorted(CONFIGS))))
@pytest.mark.parametrize("per_seq_adv", [False, True])
def test_matches_loop_reference_values_and_gradients(seed, name, per_seq_adv):
    # float64 throughout; the only differences are summation order: 1e-10 relative on values and
    # gradients (observed ~1e-15).
    cfg = {**BASE, **CONFIGS[name]}
    logits, data = random_batch(per_seq_advantages=per_seq_adv, seed=seed)
    if "positive_example_nll_weight" in cfg:
        data["rewards"] = torch.tensor([1.0, 1.0, 0.0, 0.5])  # rows 0 and 3 count (row 1 is masked)
    loss, metrics, g = assert_matches_reference(logits, data, cfg)
    assert torch.all(g[1] == 0)  # row 1 has sample_mask 0
    assert math.isfinite(metrics["loss"]) and metrics["num_valid_samples"] == 3
    assert metrics["probs_ratio_min"] <= metrics["probs_ratio"] <= metrics["probs_ratio_max"]


@pytest.mark.parametrize("on_policy", [False, True])
def test_kl_uses_curr_logprobs_unfiltered(on_policy):
    # The KL term (estimator and weight) reads the unfiltered log-probs when given; here those of
    # the logits at temperature 1.25, so both the value and the gradient differ from curr's. 1e-10.
    cfg = {**BASE, "reference_policy_kl_penalty": 0.7, "use_on_policy_kl_approximation": on_policy}
    logits, data = random_batch(seed=3)
    data["curr_logprobs_unfiltered"] = aligned_logprobs(logits * 0.8, data["input_ids"])
    loss, _, _ = assert_matches_reference(logits, data, cfg)
    gvs, gvt = global_counts(data)
    del data["curr_logprobs_unfiltered"]
    assert not torch.isclose(ClippedPGLossFn(cfg)(logits, data, gvs, gvt)[0], loss)
    data["curr_logprobs_unfiltered"] = torch.zeros(4, 6)
    with pytest.raises(ValueError, match="curr_logprobs_unfiltered must be"):
        ClippedPGLossFn(cfg)(logits, data, gvs, gvt)


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


def test_missing_keys_take_nemo_rls_defaults():
    """NeMo RL's ClippedPGLossConfig defaults every key: an empty config is its default loss."""
    logits, data = random_batch()
    defaults = {"reference_policy_kl_penalty": 0.01, "ratio_clip_min": 0.2, "ratio_clip_max": 0.2,
                "use_on_policy_kl_approximation": False, "use_importance_sampling_correction": False,
                "token_level_loss": True}
    counts = global_counts(data)
    implicit, _ = ClippedPGLossFn({})(logits, data, *counts)
    explicit, _ = ClippedPGLossFn(defaults)(logits, data, *counts)
    torch.testing.assert_close(implicit, explicit, rtol=0, atol=0)
    with pytest.raises(ValueError, match="unknown key.*ratio_clip"):
        ClippedPGLossFn({"ratio_clip": 0.2})


def test_kl_needs_reference_logprobs():
    logits, data = random_batch()
    del data["reference_policy_logprobs"]
    gvs, gvt = global_counts(data)
    with pytest.raises(ValueError, match="reference_policy_logprobs"):
        ClippedPGLossFn(BASE)(logits, data, gvs, gvt)
    loss, metrics = ClippedPGLossFn({**BASE, "reference_policy_kl_penalty": 0.0})(logits, data, gvs, gvt)
    assert metrics["kl_penalty"] == 0.0 and torch.isfinite(loss)


@pytest.mark.parametrize("input_clamp,kl_value,curr_grad", [
    # ref - curr = -24 is clamped to -20: k3 = e^-20 - 1 + 20, times the weight exp(curr - gen) = 0.1
    # gives 1.9 (below the output clamp). Clamped, the token has no KL gradient at all (NeMo RL
    # detaches the weight there); before the fix it kept d(w * k)/d curr = w * k = 1.9.
    (20.0, 0.1 * (math.exp(-20) + 19), 0.0),
    # Unclamped (bound 25): k3 = e^-24 + 23; d/d curr [w * k] = w * k + w * (1 - e^-24).
    (25.0, 0.1 * (math.exp(-24) + 23), 0.1 * (math.exp(-24) + 23) + 0.1 * (1 - math.exp(-24))),
])
def test_input_clamp_stops_the_kl_gradient(input_clamp, kl_value, curr_grad):
    logits = torch.zeros(1, 2, 2, dtype=torch.float64, requires_grad=True)
    curr = math.log(0.5)  # logits [0, 0]
    lp = lambda x: torch.tensor([[0.0, x]], dtype=torch.float64)  # noqa: E731
    data = {
        "input_ids": torch.tensor([[0, 1]]),
        "token_mask": torch.tensor([[0.0, 1.0]]),
        "sample_mask": torch.ones(1),
        "advantages": torch.zeros(1, 2, dtype=torch.float64),
        "prev_logprobs": lp(curr),
        "generation_logprobs": lp(curr - math.log(0.1)),  # weight exp(curr - gen) = 0.1
        "reference_policy_logprobs": lp(curr - 24.0),  # log-ratio ref - curr = -24
    }
    cfg = {**BASE, "reference_policy_kl_penalty": 1.0, "use_on_policy_kl_approximation": True,
           "kl_input_clamp_value": input_clamp}
    loss, metrics = ClippedPGLossFn(cfg)(logits, data, 1, 1)
    loss.backward()
    # float64; 1e-12 relative. d logp(token 1) / d logit 1 = 1 - 1/2, and the actor term is 0 (A = 0).
    assert metrics["kl_penalty"].item() == pytest.approx(kl_value, rel=1e-12)
    assert logits.grad[0, 0, 1].item() == pytest.approx(curr_grad * 0.5, rel=1e-12, abs=1e-15)
