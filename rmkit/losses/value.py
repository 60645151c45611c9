"""PPO with a critic: value alignment, GAE and the clipped value loss (NeMo RL's `gae` estimator and
`MseValueLossFn`). GAE https://arxiv.org/abs/1506.02438; VAPO's decoupled and length-adaptive
lambda https://arxiv.org/abs/2504.05118.

Alignment. Like `prev_logprobs`, per-token values are `[B, S]` aligned with `input_ids`:
`values[b, t]` = V(input_ids[b, :t]), the value of the state in which token t is generated, which is
the value head's output at position t - 1 (position 0 has none and holds 0). `aligned_values` makes
that layout from the head's `[B, S]` output (NeMo RL's value workers shift the same way). `returns`
from `gae_advantages` are aligned the same way, and `MseValueLossFn` takes the head's raw output, as
the other losses take `next_token_logits`, and does the shift itself.
"""

from __future__ import annotations

from typing import Any

import torch

from rmkit.losses.advantages import AllReduceSum, kl_in_reward
from rmkit.losses.configs import MseValueLossConfig, validate_value_loss
from rmkit.losses.masking import compute_dtype, masked_mean
from rmkit.losses.nll import loss_token_mask


def aligned_values(value_head_output: torch.Tensor) -> torch.Tensor:
    """`[B, S]` values aligned with input_ids from the head's `[B, S]` (or `[B, S, 1]`) output:
    `out[:, t] = head[:, t - 1]`, `out[:, 0] = 0`."""
    head = _squeeze_head(value_head_output)
    return torch.cat([torch.zeros_like(head[:, :1]), head[:, :-1]], dim=1)


def _squeeze_head(x: torch.Tensor) -> torch.Tensor:
    return x.squeeze(-1) if x.dim() == 3 and x.shape[-1] == 1 else x


def token_level_rewards(rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None) -> torch.Tensor:
    """`[B, S]`: each row's reward at its last masked token, minus `kl` (already weighted) at every
    masked token; 0 outside the mask. Rows without a masked token get nothing."""
    valid = mask > 0
    out = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    if kl is not None:
        out = out - kl.to(out.dtype)
    last = mask.shape[1] - 1 - valid.int().fliplr().argmax(dim=1)
    rows = valid.any(dim=1).nonzero(as_tuple=True)[0]
    out[rows, last[rows]] += rewards[rows]
    return torch.where(valid, out, torch.zeros_like(out))


def _gae_scan(rewards, values, mask, gamma, lam) -> torch.Tensor:
    """Backward recursion `A_t = delta_t + gamma * lam * A_next`, `delta_t = r_t + gamma * V_next - V_t`,
    where "next" is the next *masked* token: masked-out positions (prompt, padding, other turns) are
    skipped, carrying both accumulators over them. Returns `[B, S]` (masked-out positions hold the
    carried value; the caller zeroes them)."""
    valid = mask > 0
    next_value = torch.zeros(values.shape[0], dtype=values.dtype, device=values.device)
    last_adv = torch.zeros_like(next_value)
    out = []
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        new_adv = delta + gamma * lam * last_adv
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        last_adv = torch.where(valid[:, t], new_adv, last_adv)
        out.append(last_adv)
    return torch.stack(out[::-1], dim=1)


def _whiten(x: torch.Tensor, mask: torch.Tensor, all_reduce_sum: AllReduceSum | None = None) -> torch.Tensor:
    """NeMo RL's GAE whitening over the mask: unbiased var, 1e-8 in the divisors as it has them; with
    `all_reduce_sum` (data parallel) over every rank's tokens, as one batch."""
    reduce = all_reduce_sum or (lambda t: t)
    total, n = reduce(torch.stack([(x * mask).sum(), mask.sum()])).unbind()
    mean = total / (n + 1e-8)
    var = reduce(((x - mean) ** 2 * mask).sum()) / (n + 1e-8) * (n / (n - 1))
    return (x - mean) * torch.rsqrt(var + 1e-8)


def gae_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gae_gamma: float,
    gae_lambda: float,
    normalize_advantages: bool = False,
    gae_lambda_value: float | None = None,
    gae_lambda_policy: float | None = None,
    length_adaptive_alpha: float = 0.0,
    use_kl_in_reward: bool = False,
    reference_policy_kl_penalty: float = 0.0,
    reference_policy_kl_type: str = "k3",
    logprobs: torch.Tensor | None = None,
    reference_logprobs: torch.Tensor | None = None,
    all_reduce_sum: AllReduceSum | None = None,
    value_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and returns (NeMo RL's GeneralizedAdvantageEstimator; config keys as its
    `adv_estimator` with `name: gae`).

    Token rewards: the sequence reward at the last masked token, minus `reference_policy_kl_penalty *
    kl_in_reward(...)` at every masked token when `use_kl_in_reward` (and the penalty > 0 and both
    log-probs are given). Then `_gae_scan` (skipping masked-out positions). `returns = A + V` uses
    `gae_lambda_value` (default gae_lambda); the advantages use `gae_lambda_policy`, or with
    `length_adaptive_alpha > 0` the per-row `clamp(1 - 1 / max(alpha * response_length, 1), 0, 1)`,
    or gae_lambda. `normalize_advantages` whitens the advantages over the mask (not the returns).

    Args:
        rewards: `[B]` sequence rewards.
        values: `[B, S]` aligned with input_ids (module docstring; `aligned_values`).
        mask: `[B, S]` tokens the policy trains on (`response_mask(token_mask, sample_mask)`).
        logprobs / reference_logprobs: `[B, S]` aligned with input_ids, for the KL in the reward.
        all_reduce_sum: data parallel: sums a tensor over the ranks, so `normalize_advantages` whitens
            over every rank's tokens (the rows are split over ranks; the scan itself is per row).
        value_mask: `[B, S]` the states the critic values, when they are more than `mask`'s tokens (TRL's
            PPOTrainer: also the state after a finished completion's last token). The reward goes at each row's
            last value_mask position and GAE runs over value_mask, the KL stays on `mask`'s tokens, the returns
            cover value_mask and the advantages `mask` (whitened over it). Default: `mask`.

    Returns:
        `(advantages [B, S], returns [B, S])`, 0 outside `mask` and `value_mask` respectively.
    """
    dtype = compute_dtype(values)
    value_mask = mask if value_mask is None else value_mask
    zero = torch.zeros((), dtype=dtype, device=values.device)
    values = torch.where(value_mask > 0, values.to(dtype), zero)
    kl = None
    if use_kl_in_reward and reference_policy_kl_penalty > 0 and logprobs is not None and reference_logprobs is not None:
        kl = reference_policy_kl_penalty * kl_in_reward(logprobs.to(dtype), reference_logprobs.to(dtype),
                                                        reference_policy_kl_type)
        kl = torch.where(mask > 0, kl, zero)
    token_rewards = token_level_rewards(rewards.to(dtype), value_mask, kl)
    lam_value = gae_lambda if gae_lambda_value is None else gae_lambda_value
    lam_policy: float | torch.Tensor = gae_lambda if gae_lambda_policy is None else gae_lambda_policy
    if length_adaptive_alpha > 0:
        lengths = (mask > 0).sum(dim=1).to(dtype)
        lam_policy = (1.0 - 1.0 / (length_adaptive_alpha * lengths).clamp(min=1.0)).clamp(0.0, 1.0)
    value_adv = _gae_scan(token_rewards, values, value_mask, gae_gamma, lam_value)
    decoupled = gae_lambda_value is not None or gae_lambda_policy is not None or length_adaptive_alpha > 0
    advantages = _gae_scan(token_rewards, values, value_mask, gae_gamma, lam_policy) if decoupled else value_adv
    valid = mask > 0
    if normalize_advantages:
        advantages = _whiten(advantages, valid.to(dtype), all_reduce_sum)
    return torch.where(valid, advantages, zero), torch.where(value_mask > 0, value_adv + values, zero)


class MseValueLossFn:
    """Clipped value loss `0.5 * scale * mean(max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2))`.

    Called as `loss_fn(value_head_output, data, global_valid_seqs, global_valid_toks)` with the value
    head's output `[B, S]` or `[B, S, 1]` (position t: V(input_ids[:, :t+1]), as logits predict t+1) and
    `data` holding `token_mask [B, S]`, `sample_mask [B]`, `returns [B, S]` and, with clipping,
    `values [B, S]` (the rollout's values), both aligned with input_ids (`gae_advantages`,
    `aligned_values`). The loss compares `head[:, :-1]` with `returns[:, 1:]` on
    `token_mask[:, 1:] * sample_mask` and divides by `global_valid_toks`, so microbatch losses add
    up to the full batch's. Without clipping the max is just the first term.

    Metrics (additive unless `_min` / `_max`): `loss`, `vf_clipfrac` (share of tokens where the
    clipped term is larger), `returns_mean`, `values_mean`, `returns_sq_mean`, `residual_sq_mean`
    (summed over microbatches they give `value_explained_variance`), `values_min`, `values_max`
    (inf / -inf without a valid token), `num_valid_samples` (sum of sample_mask).
    """

    def __init__(self, cfg: dict | MseValueLossConfig | None = None):
        cfg = validate_value_loss({} if cfg is None else cfg)
        self.scale = float(cfg["scale"])
        self.cliprange = cfg["cliprange"] or None

    def __call__(
        self,
        value_head_output: torch.Tensor,
        data: dict[str, Any],
        global_valid_seqs: torch.Tensor | float | None,
        global_valid_toks: torch.Tensor | float,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        head = _squeeze_head(value_head_output)
        dtype = compute_dtype(head)
        mask = loss_token_mask(data, dtype)
        pred = head[:, :-1].to(dtype)
        returns = _masked_shift(data["returns"], mask)
        unclipped = (pred - returns) ** 2
        losses, clipped_wins = unclipped, torch.zeros_like(unclipped)
        if self.cliprange is not None:
            old = _masked_shift(data["values"], mask)
            clipped = (torch.clamp(pred, old - self.cliprange, old + self.cliprange) - returns) ** 2
            losses = torch.max(unclipped, clipped)
            clipped_wins = (clipped > unclipped).to(dtype)
        loss = 0.5 * self.scale * masked_mean(losses, mask, global_valid_toks)
        with torch.no_grad():
            pred = pred.detach()
            metrics = {
                "loss": loss.detach(),
                "vf_clipfrac": masked_mean(clipped_wins, mask, global_valid_toks),
                "returns_mean": masked_mean(returns, mask, global_valid_toks),
                "values_mean": masked_mean(pred, mask, global_valid_toks),
                "returns_sq_mean": masked_mean(returns**2, mask, global_valid_toks),
                "residual_sq_mean": masked_mean((returns - pred) ** 2, mask, global_valid_toks),
                "values_min": _masked_extreme(pred, mask, torch.amin, float("inf")),
                "values_max": _masked_extreme(pred, mask, torch.amax, float("-inf")),
                "num_valid_samples": data["sample_mask"].detach().to(dtype).sum(),
            }
        return loss, metrics


def _masked_shift(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`x[:, 1:]` in mask's dtype, 0 where mask is 0 (padding may hold anything)."""
    x = x[:, 1:].to(mask.dtype)
    return torch.where(mask > 0, x, torch.zeros_like(x))


def _masked_extreme(x: torch.Tensor, mask: torch.Tensor, reduce, empty: float) -> torch.Tensor:
    """`reduce(x)` over the mask, or `empty` (inf / -inf, which `reduce_metrics` skips) without tokens."""
    return reduce(torch.where(mask > 0, x, torch.full_like(x, empty))) if x.numel() else x.new_tensor(empty)


def value_explained_variance(metrics: dict[str, Any]) -> torch.Tensor:
    """`1 - Var(R - V) / max(Var(R), 1e-8)` over the batch from `MseValueLossFn`'s metrics, summed
    over every microbatch (`reduce_metrics`), as NeMo RL's PPO logs `critic/explained_var`."""
    r_mean, v_mean = (torch.as_tensor(metrics[k], dtype=torch.float64) for k in ("returns_mean", "values_mean"))
    returns_var = torch.as_tensor(metrics["returns_sq_mean"], dtype=torch.float64) - r_mean**2
    residual_var = torch.as_tensor(metrics["residual_sq_mean"], dtype=torch.float64) - (r_mean - v_mean) ** 2
    return 1.0 - residual_var / returns_var.clamp(min=1e-8)
