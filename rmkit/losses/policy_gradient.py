"""Clipped policy-gradient loss with a KL penalty: PPO, GRPO, REINFORCE / RLOO, dual clip.

PPO https://arxiv.org/abs/1707.06347, GRPO https://arxiv.org/abs/2402.03300, REINFORCE / RLOO
https://arxiv.org/abs/2402.14740, dual clip https://arxiv.org/abs/1912.09729, DAPO's asymmetric clip
https://arxiv.org/abs/2503.14476, KL estimators k1/k2/k3 http://joschu.net/blog/kl-approx.html.
"""

from __future__ import annotations

from typing import Any, TypedDict

import torch

from rmkit.losses.dpo import check_config_keys
from rmkit.losses.kl import KL_ESTIMATORS, calculate_kl
from rmkit.losses.logprobs import next_token_logprobs
from rmkit.losses.masking import masked_mean
from rmkit.losses.nll import loss_token_mask


class ClippedPGLossConfig(TypedDict, total=False):
    """Keys of `ClippedPGLossFn`'s config. The first six are required."""

    reference_policy_kl_penalty: float  # beta >= 0
    ratio_clip_min: float  # eps_min: ratio clipped below at 1 - eps_min
    ratio_clip_max: float  # eps_max: ratio clipped above at 1 + eps_max
    use_on_policy_kl_approximation: bool  # weight the KL by exp(curr - gen)
    use_importance_sampling_correction: bool  # weight the actor loss by exp(prev - gen)
    token_level_loss: bool  # True: mean over the global tokens; False: per-sequence token mean
    ratio_clip_c: float | None  # dual clip c > 1 (None: off). Default None
    disable_ppo_ratio: bool  # REINFORCE / RLOO: actor loss -A * logp, no ratio. Default False
    reference_policy_kl_type: str  # "k1", "k2" or "k3". Default "k3"
    kl_input_clamp_value: float | None  # clamp of ref - curr before the estimator. Default 20
    kl_output_clamp_value: float | None  # clamp of the weighted estimator. Default 10


REQUIRED_KEYS = {
    "reference_policy_kl_penalty",
    "ratio_clip_min",
    "ratio_clip_max",
    "use_on_policy_kl_approximation",
    "use_importance_sampling_correction",
    "token_level_loss",
}
DEFAULTS = {
    "ratio_clip_c": None,
    "disable_ppo_ratio": False,
    "reference_policy_kl_type": "k3",
    "kl_input_clamp_value": 20.0,
    "kl_output_clamp_value": 10.0,
}

def _finite(x: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


def _masked_input(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`x[:, 1:]` in float32 with 0 where `mask` (`[B, S-1]`) is 0."""
    x = x[:, 1:].to(mask.dtype)
    return torch.where(mask > 0, x, torch.zeros_like(x))


def _validate(cfg: dict) -> dict:
    check_config_keys(cfg, REQUIRED_KEYS, set(DEFAULTS), "ClippedPGLossConfig")
    cfg = {**DEFAULTS, **cfg}
    if cfg["reference_policy_kl_penalty"] < 0:
        raise ValueError("ClippedPGLossConfig: reference_policy_kl_penalty must be >= 0")
    if not cfg["disable_ppo_ratio"]:
        if not 0 <= cfg["ratio_clip_min"] <= 1 or cfg["ratio_clip_max"] < 0:
            raise ValueError(
                "ClippedPGLossConfig: need 0 <= ratio_clip_min <= 1 and ratio_clip_max >= 0, got "
                f"{cfg['ratio_clip_min']} and {cfg['ratio_clip_max']}"
            )
    c = cfg["ratio_clip_c"]
    if c is not None:
        if c <= 1:
            raise ValueError(f"ClippedPGLossConfig: ratio_clip_c (dual clip) must be > 1, got {c}")
        if cfg["disable_ppo_ratio"]:
            raise ValueError("ClippedPGLossConfig: ratio_clip_c needs the PPO ratio; unset disable_ppo_ratio")
    if cfg["reference_policy_kl_type"] not in KL_ESTIMATORS:
        raise ValueError(
            f"ClippedPGLossConfig: unknown reference_policy_kl_type {cfg['reference_policy_kl_type']!r}; "
            f"choose one of {sorted(KL_ESTIMATORS)}"
        )
    for key in ("kl_input_clamp_value", "kl_output_clamp_value"):
        if cfg[key] is not None and cfg[key] <= 0:
            raise ValueError(f"ClippedPGLossConfig: {key} must be > 0 or None, got {cfg[key]}")
    return cfg


class ClippedPGLossFn:
    """Generalized clipped policy-gradient loss with a KL penalty (NeMo RL's ClippedPGLossFn).

    Per valid token t (mask = `token_mask[:, 1:] * sample_mask`), with `curr` the log-probs of
    `input_ids[:, 1:]` from `next_token_logits [B, S, V]`, `prev`/`gen`/`ref` = `data[...][:, 1:]`:

        r = exp(curr - prev)                         (REINFORCE: the actor term is -A * curr)
        actor = max(-A * r, -A * clip(r, 1 - eps_min, 1 + eps_max))
        actor = min(actor, -A * c)  where A < 0      (dual clip, ratio_clip_c)
        actor *= exp(prev - gen)                     (use_importance_sampling_correction)
        kl = clamp_out(w * k(clamp_in(ref - curr)))  w = exp(curr - gen) (on-policy approximation),
                                                     else exp(curr - curr.detach()) (value 1)
        loss = reduce(actor) + beta * reduce(kl)

    `w` carries the score-function part of the KL's gradient, except on tokens where the input
    clamp is active: there it is detached, so such a token gets no KL gradient at all. `reduce` is the
    masked sum over `global_valid_toks` (token_level_loss) or each sequence's token mean summed
    over `global_valid_seqs`. `advantages` is `[B, S]` aligned with input_ids, or `[B]` (one value
    per sequence). `reference_policy_logprobs` may be absent when beta == 0.

    Metrics (additive unless `_min`/`_max`): `loss`, `actor_loss`, `kl_penalty` (unweighted KL),
    `probs_ratio`, `probs_ratio_clamped`, `probs_ratio_min`, `probs_ratio_max` (inf / -inf without
    valid tokens), `token_mult_prob_error` (mean exp|gen - prev|), `approx_entropy`
    (mean -exp(curr - gen) * curr), `num_valid_samples`.

    `inplace_backward=True` computes the log-probs with `next_token_logprobs(..., inplace_backward=True)`:
    the backward writes the logits' gradient into the logits' storage (no new `[B, S, V]` buffer).
    """

    def __init__(self, cfg: ClippedPGLossConfig, inplace_backward: bool = False):
        self.inplace_backward = inplace_backward
        self.cfg = _validate(dict(cfg))
        self.beta = float(self.cfg["reference_policy_kl_penalty"])

    def _reduce(self, values, mask, global_valid_seqs, global_valid_toks) -> torch.Tensor:
        if self.cfg["token_level_loss"]:
            return masked_mean(values, mask, global_valid_toks)
        per_seq = masked_mean(values, mask, dim=-1)
        return masked_mean(per_seq, (mask.sum(-1) > 0).to(per_seq.dtype), global_valid_seqs)

    def _kl(self, curr, data, mask, gvs, gvt) -> torch.Tensor:
        ref = _masked_input(data["reference_policy_logprobs"], mask)
        if self.cfg["use_on_policy_kl_approximation"]:
            weight = _finite(torch.exp(curr - _masked_input(data["generation_logprobs"], mask)))
        else:
            weight = torch.exp(curr - curr.detach())
        kl = calculate_kl(
            curr,
            ref,
            self.cfg["reference_policy_kl_type"],
            self.cfg["kl_input_clamp_value"],
            self.cfg["kl_output_clamp_value"],
            importance_weights=weight,
        )
        return self._reduce(kl, mask, gvs, gvt)

    def _actor(self, curr, prev, gen, advantages, mask, gvs, gvt):
        cfg = self.cfg
        ratio = torch.exp(curr - prev)
        ratio_clamped = ratio.clamp(1 - cfg["ratio_clip_min"], 1 + cfg["ratio_clip_max"])
        if cfg["disable_ppo_ratio"]:
            actor = -advantages * curr
        else:
            actor = torch.max(-advantages * ratio, -advantages * ratio_clamped)
            if cfg["ratio_clip_c"] is not None:
                dual = torch.min(actor, -advantages * cfg["ratio_clip_c"])
                actor = torch.where(advantages < 0, dual, actor)
        if cfg["use_importance_sampling_correction"]:
            actor = actor * _finite(torch.exp(prev - gen))
        return self._reduce(actor, mask, gvs, gvt), ratio.detach(), ratio_clamped.detach()

    def __call__(
        self,
        next_token_logits: torch.Tensor,
        data: dict[str, Any],
        global_valid_seqs: torch.Tensor | float,
        global_valid_toks: torch.Tensor | float,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        gvs, gvt = global_valid_seqs, global_valid_toks
        curr = next_token_logprobs(next_token_logits, data["input_ids"], inplace_backward=self.inplace_backward)
        mask = loss_token_mask(data, curr.dtype)
        # Zero the inputs outside the mask: padding may hold anything (-inf log-probs), and
        # inf * 0 would turn the masked sums into NaN.
        prev = _masked_input(data["prev_logprobs"], mask)
        gen = _masked_input(data["generation_logprobs"], mask)
        advantages = data["advantages"].to(curr.dtype)
        advantages = (
            advantages[:, None] * (mask > 0) if advantages.dim() == 1 else _masked_input(advantages, mask)
        )

        actor, ratio, ratio_clamped = self._actor(curr, prev, gen, advantages, mask, gvs, gvt)
        loss = actor
        kl = torch.zeros((), dtype=curr.dtype, device=curr.device)
        if "reference_policy_logprobs" in data:
            kl = self._kl(curr, data, mask, gvs, gvt)
            if self.beta:
                loss = loss + self.beta * kl
        elif self.beta:
            raise ValueError(
                "ClippedPGLossFn: reference_policy_kl_penalty > 0 needs reference_policy_logprobs"
            )
        return loss, self._metrics(
            loss, actor, kl, curr.detach(), prev, gen, ratio, ratio_clamped, mask, data, gvt
        )

    @torch.no_grad()
    def _metrics(self, loss, actor, kl, curr, prev, gen, ratio, ratio_clamped, mask, data, gvt) -> dict:
        return {
            "loss": loss.detach(),
            "actor_loss": actor.detach(),
            "kl_penalty": kl.detach(),
            "probs_ratio": masked_mean(ratio, mask, gvt),
            "probs_ratio_clamped": masked_mean(ratio_clamped, mask, gvt),
            "probs_ratio_min": _masked_extreme(ratio, mask, torch.amin, float("inf")),
            "probs_ratio_max": _masked_extreme(ratio, mask, torch.amax, float("-inf")),
            "token_mult_prob_error": masked_mean(torch.exp((gen - prev).abs()), mask, gvt),
            "approx_entropy": masked_mean(-torch.exp(curr - gen) * curr, mask, gvt),
            "num_valid_samples": data["sample_mask"].detach().float().sum(),
        }


def _masked_extreme(values: torch.Tensor, mask: torch.Tensor, reduce, empty: float) -> torch.Tensor:
    """`reduce` (amin / amax) of `values` `[B, S-1]` where `mask` is 1, or `empty` (the reduction's
    identity, inf / -inf) where no entry is: a 0-dim tensor, without reading the mask on the host."""
    if values.numel() == 0:
        return torch.tensor(empty, dtype=values.dtype, device=values.device)
    return reduce(torch.where(mask > 0, values, torch.full_like(values, empty)))
