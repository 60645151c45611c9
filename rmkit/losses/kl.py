"""Per-token estimates of KL(pi || pi_ref) from sampled tokens, with NeMo RL's clamps.

Schulman's estimators (http://joschu.net/blog/kl-approx.html), named as NeMo RL names them, of
`log_ratio = log pi_ref(y) - log pi(y)` for a token y sampled from pi:

    k1 = -log_ratio                         unbiased, can be negative
    k2 = log_ratio^2 / 2                    biased, low variance
    k3 = exp(log_ratio) - 1 - log_ratio     unbiased, always >= 0
"""

from __future__ import annotations

import torch

KL_ESTIMATORS = {
    "k1": lambda log_ratio: -log_ratio,
    "k2": lambda log_ratio: torch.square(log_ratio) / 2,
    "k3": lambda log_ratio: torch.exp(log_ratio) - 1 - log_ratio,
}


def calculate_kl(
    logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor,
    kl_type: str = "k3",
    input_clamp_value: float | None = 20.0,
    output_clamp_value: float | None = 10.0,
    importance_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL estimate `clamp_out(w * k(clamp_in(reference_logprobs - logprobs)))`.

    Args:
        logprobs: `[B, S]` (any shape) log-probs of the sampled tokens under the policy.
        reference_logprobs: the same tokens' log-probs under the reference policy, same shape.
        kl_type: "k1", "k2" or "k3" (see the module docstring).
        input_clamp_value: the log-ratio is clamped to `[-v, v]` first (None: no clamp).
        output_clamp_value: the weighted estimate is clamped to `[-v, v]` last (None: no clamp).
        importance_weights: per-token weights `w`, e.g. `exp(curr - gen)` for the on-policy KL
            approximation, multiplied in before the output clamp. On tokens whose log-ratio the
            input clamp changed, `w` is detached: the clamp makes the estimate constant there, and
            the weight's own (score-function) gradient is stopped with it, as in NeMo RL.

    Returns:
        The per-token estimates, shaped like `logprobs`; differentiable where not clamped.
    """
    if kl_type not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL type {kl_type!r}; choose one of {sorted(KL_ESTIMATORS)}")
    log_ratio = reference_logprobs - logprobs
    if input_clamp_value is not None:
        clamped = log_ratio.clamp(min=-input_clamp_value, max=input_clamp_value)
        if importance_weights is not None:
            importance_weights = torch.where(
                clamped == log_ratio, importance_weights, importance_weights.detach()
            )
        log_ratio = clamped
    kl = KL_ESTIMATORS[kl_type](log_ratio)
    if importance_weights is not None:
        kl = importance_weights * kl
    if output_clamp_value is not None:
        kl = kl.clamp(min=-output_clamp_value, max=output_clamp_value)
    return kl
