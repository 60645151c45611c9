"""Clipped policy-gradient loss with a KL penalty: PPO, GRPO, REINFORCE / RLOO, GSPO, CISPO, dual clip.

PPO https://arxiv.org/abs/1707.06347, GRPO https://arxiv.org/abs/2402.03300, REINFORCE / RLOO
https://arxiv.org/abs/2402.14740, GSPO https://arxiv.org/abs/2507.18071, CISPO
https://arxiv.org/abs/2506.13585, dual clip https://arxiv.org/abs/1912.09729, DAPO's asymmetric clip
https://arxiv.org/abs/2503.14476, VAPO's positive-example NLL https://arxiv.org/abs/2504.05118,
KL estimators k1/k2/k3 http://joschu.net/blog/kl-approx.html (see `rmkit.losses.kl`).
"""

from __future__ import annotations

from typing import Any

import torch

from rmkit.losses.configs import ClippedPGLossConfig, validate_clipped_pg
from rmkit.losses.kl import KL_ESTIMATORS, calculate_kl
from rmkit.losses.logprobs import next_token_logprobs
from rmkit.losses.masking import masked_mean
from rmkit.losses.nll import loss_token_mask


def _finite(x: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


def _masked_input(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`x[:, 1:]` in float32 with 0 where `mask` (`[B, S-1]`) is 0."""
    x = x[:, 1:].to(mask.dtype)
    return torch.where(mask > 0, x, torch.zeros_like(x))


def _metric_normalizations(cfg: dict) -> dict[str, str]:
    """Which global count each metric was divided by: "tokens" (global_valid_toks), "sequences"
    (global_valid_seqs) or "none" (counts, extrema, the positive NLL's own mean). NeMo RL's table."""
    loss = "tokens" if cfg["token_level_loss"] else "sequences"
    norms = {key: loss for key in ("loss", "actor_loss", "kl_penalty")}
    for key in ("probs_ratio", "probs_ratio_clamped", "token_mult_prob_error", "gen_kl_error",
                "policy_kl_error", "js_divergence_error", "approx_entropy"):
        norms[key] = "tokens"
    norms["sampling_importance_ratio"] = "sequences" if cfg["sequence_level_importance_ratios"] else "tokens"
    for key in ("num_valid_samples", "positive_nll_loss", "probs_ratio_min", "probs_ratio_max",
                "probs_ratio_clamped_min", "probs_ratio_clamped_max"):
        norms[key] = "none"
    kind = cfg["truncated_importance_sampling_type"]
    if kind is not None:
        norms["is_oob_ratio"] = "sequences" if kind == "seq-mask-tis" else "tokens"
    return norms


class ClippedPGLossFn:
    """Generalized clipped policy-gradient loss with a KL penalty (NeMo RL's ClippedPGLossFn).

    Per valid token t (mask = `token_mask[:, 1:] * sample_mask`), with `curr` the log-probs of
    `input_ids[:, 1:]` from `next_token_logits [B, S, V]`, `prev`/`gen`/`ref` = `data[...][:, 1:]`:

        r = exp(curr - prev)                        GSPO: exp(mean_t(curr - prev)) per sequence;
                                                    force_on_policy_ratio: exp(curr - sg(curr)) = 1
        actor = max(-A * r, -A * clip(r, 1 - eps_min, 1 + eps_max))
                = -A * curr                         (REINFORCE, disable_ppo_ratio)
                = -A * sg(clip(r, ...)) * curr      (CISPO, use_cispo)
        actor = min(actor, -A * c)  where A < 0     (dual clip, ratio_clip_c)
        actor *= w = exp(prev - gen)                (use_importance_sampling_correction; GSPO:
                                                    sg(exp(sum_t(prev - gen))) per sequence;
                                                    truncated per truncated_importance_sampling_type)
        kl = calculate_kl(curr, ref, w_kl)          w_kl = exp(curr - gen) (on-policy approximation),
                                                    else exp(curr - sg(curr)) (value 1)
        loss = reduce(actor) + beta * reduce(kl) + mu * NLL(rows with rewards > 0)

    `w_kl` carries the score-function part of the KL's gradient, except on tokens where the input
    clamp is active: there it is detached, so such a token gets no KL gradient at all. `reduce` is
    the masked sum over `global_valid_toks` (token_level_loss) or each sequence's token mean summed
    over `global_valid_seqs`. `advantages` is `[B, S]` aligned with input_ids, or `[B]` (one value
    per sequence). `reference_policy_logprobs` may be absent when beta == 0 (or use_kl_in_reward).
    `prev_logprobs` is not read with force_on_policy_ratio (prev = sg(curr)). Optional
    `curr_logprobs_unfiltered` `[B, S]` (aligned with input_ids, differentiable): the policy's
    log-probs without top-k / top-p filtering, used instead of curr in the KL term (NeMo RL sets
    it when the logits were filtered). `rewards` `[B]` is read when positive_example_nll_weight > 0;
    that NLL is divided by this call's own count of such tokens, so it is not additive across
    microbatches (as in NeMo RL).

    Metrics (additive unless `_min`/`_max`; `metric_normalizations` says which global count each
    was divided by): `loss`, `actor_loss`, `kl_penalty` (unweighted KL), `probs_ratio`,
    `probs_ratio_clamped`, `probs_ratio[_clamped]_min` / `_max` (inf / -inf without valid tokens),
    `token_mult_prob_error` (mean exp|gen - prev|), `gen_kl_error` (KL estimate of gen vs prev),
    `policy_kl_error` (prev vs gen), `js_divergence_error`, `sampling_importance_ratio` (mean actor
    weight), `is_oob_ratio` (with truncated IS: the fraction of tokens, or of sequences for
    seq-mask-tis, outside the bounds), `approx_entropy` (mean -exp(curr - gen) * curr),
    `positive_nll_loss`, `num_valid_samples`.

    `inplace_backward=True` computes the log-probs with `next_token_logprobs(..., inplace_backward=True)`:
    the backward writes the logits' gradient into the logits' storage (no new `[B, S, V]` buffer).
    """

    def __init__(self, cfg: dict | ClippedPGLossConfig, inplace_backward: bool = False):
        self.inplace_backward = inplace_backward
        self.cfg = validate_clipped_pg(cfg)
        self.beta = 0.0 if self.cfg["use_kl_in_reward"] else float(self.cfg["reference_policy_kl_penalty"])
        self.nll_weight = float(self.cfg["positive_example_nll_weight"])
        self.metric_normalizations = _metric_normalizations(self.cfg)

    def _reduce(self, values, mask, global_valid_seqs, global_valid_toks) -> torch.Tensor:
        if self.cfg["token_level_loss"]:
            return masked_mean(values, mask, global_valid_toks)
        per_seq = masked_mean(values, mask, dim=-1)
        return masked_mean(per_seq, (mask.sum(-1) > 0).to(per_seq.dtype), global_valid_seqs)

    def _kl(self, curr, gen, data, mask, gvs, gvt) -> torch.Tensor:
        if "curr_logprobs_unfiltered" in data:
            if data["curr_logprobs_unfiltered"].shape != data["input_ids"].shape:
                raise ValueError("ClippedPGLossFn: curr_logprobs_unfiltered must be [B, S], aligned with input_ids")
            curr = _masked_input(data["curr_logprobs_unfiltered"], mask)
        ref = _masked_input(data["reference_policy_logprobs"], mask)
        if self.cfg["use_on_policy_kl_approximation"]:
            weight = torch.exp(curr - gen)
        else:
            weight = torch.exp(curr - curr.detach())
        kl = calculate_kl(
            curr,
            ref,
            self.cfg["reference_policy_kl_type"],
            self.cfg["kl_input_clamp_value"],
            self.cfg["kl_output_clamp_value"],
            importance_weights=_finite(weight),
        )
        return self._reduce(kl, mask, gvs, gvt)

    def _ratios(self, curr, prev, mask) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        if cfg["force_on_policy_ratio"]:
            ratio = torch.exp(curr - curr.detach())  # 1, with curr's gradient; never clipped
            return ratio, ratio
        log_ratio = curr - prev
        if cfg["sequence_level_importance_ratios"]:
            ratio = torch.exp(masked_mean(log_ratio, mask, dim=-1))[:, None].expand_as(log_ratio)
        else:
            ratio = torch.exp(log_ratio)
        return ratio, ratio.clamp(1 - cfg["ratio_clip_min"], 1 + cfg["ratio_clip_max"])

    def _clip_loss(self, curr, ratio, ratio_clamped, advantages) -> torch.Tensor:
        cfg = self.cfg
        if cfg["use_cispo"]:
            return -advantages * ratio_clamped.detach() * curr
        if cfg["disable_ppo_ratio"] and not cfg["force_on_policy_ratio"]:
            return -advantages * curr
        actor = torch.max(-advantages * ratio, -advantages * ratio_clamped)
        if cfg["ratio_clip_c"] is not None:
            dual = torch.min(actor, -advantages * cfg["ratio_clip_c"])
            actor = torch.where(advantages < 0, dual, actor)
        return actor

    def _importance_weights(self, prev, gen, mask, sample_mask, gvs, gvt):
        """The actor's weights exp(prev - gen), `[B, S-1]` (GSPO: `[B, 1]`, one per sequence),
        truncated per truncated_importance_sampling_type; and `{"is_oob_ratio": ...}` if truncated."""
        cfg = self.cfg
        if cfg["sequence_level_importance_ratios"]:
            # prev and gen are 0 outside the mask, so the row sum is over the valid tokens.
            weights = _finite(torch.exp((prev - gen).sum(-1, keepdim=True)))
        else:
            weights = _finite(torch.exp(prev - gen))
        kind = cfg["truncated_importance_sampling_type"]
        if kind is None:
            return weights, {}
        high, low = cfg["truncated_importance_sampling_ratio"], cfg["truncated_importance_sampling_ratio_min"]
        if kind == "tis":
            low = 0.0 if low is None else low
            out = (weights > high) | (weights < low)
            oob = masked_mean(out.to(mask.dtype), mask, gvt)
            weights = weights.clamp(low, high)
        elif kind == "icepop":
            kept = (weights >= low) & (weights <= high)
            oob = masked_mean((~kept).to(mask.dtype), mask, gvt)
            weights = torch.where(kept, weights, torch.zeros_like(weights))
        else:  # seq-mask-tis: keep whole sequences by their geometric-mean weight
            geo_mean = torch.exp(masked_mean(_finite(prev - gen), mask, dim=-1))
            kept = ((geo_mean >= low) & (geo_mean <= high)).to(mask.dtype)
            oob = masked_mean(1 - kept, sample_mask.to(mask.dtype), gvs)
            weights = weights * kept[:, None]
        return weights, {"is_oob_ratio": oob.detach()}

    def _positive_nll(self, curr, mask, data) -> torch.Tensor:
        if "rewards" not in data:
            raise ValueError("ClippedPGLossFn: positive_example_nll_weight > 0 needs data['rewards'] ([B])")
        correct = mask * (data["rewards"] > 0).to(mask.dtype)[:, None]
        # Divided by this call's own count (0 when there is none: masked_mean gives 0, no host sync).
        return masked_mean(-curr, correct, correct.sum())

    def __call__(
        self,
        next_token_logits: torch.Tensor,
        data: dict[str, Any],
        global_valid_seqs: torch.Tensor | float,
        global_valid_toks: torch.Tensor | float,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg, gvs, gvt = self.cfg, global_valid_seqs, global_valid_toks
        curr = next_token_logprobs(next_token_logits, data["input_ids"], inplace_backward=self.inplace_backward)
        mask = loss_token_mask(data, curr.dtype)
        # Zero the inputs outside the mask: padding may hold anything (-inf log-probs), and
        # inf * 0 would turn the masked sums into NaN.
        gen = _masked_input(data["generation_logprobs"], mask)
        if cfg["force_on_policy_ratio"]:
            prev = torch.where(mask > 0, curr.detach(), torch.zeros_like(curr))
        else:
            prev = _masked_input(data["prev_logprobs"], mask)
        advantages = data["advantages"].to(curr.dtype)
        advantages = (
            advantages[:, None] * (mask > 0) if advantages.dim() == 1 else _masked_input(advantages, mask)
        )

        ratio, ratio_clamped = self._ratios(curr, prev, mask)
        actor = self._clip_loss(curr, ratio, ratio_clamped, advantages)
        weights, is_metrics = self._importance_weights(prev, gen, mask, data["sample_mask"], gvs, gvt)
        if cfg["use_importance_sampling_correction"]:
            actor = actor * weights
        actor = self._reduce(actor, mask, gvs, gvt)
        loss = actor
        kl = torch.zeros((), dtype=curr.dtype, device=curr.device)
        if "reference_policy_logprobs" in data:
            kl = self._kl(curr, gen, data, mask, gvs, gvt)
            if self.beta:
                loss = loss + self.beta * kl
        elif self.beta:
            raise ValueError(
                "ClippedPGLossFn: reference_policy_kl_penalty > 0 needs reference_policy_logprobs"
            )
        nll = torch.zeros((), dtype=curr.dtype, device=curr.device)
        if self.nll_weight:
            nll = self._positive_nll(curr, mask, data)
            loss = loss + self.nll_weight * nll

        with torch.no_grad():
            if cfg["sequence_level_importance_ratios"]:
                sampling_ratio = masked_mean(weights[:, 0], data["sample_mask"].to(mask.dtype), gvs)
            else:
                sampling_ratio = masked_mean(weights, mask, gvt)
            metrics = {
                "loss": loss.detach(),
                "actor_loss": actor.detach(),
                "kl_penalty": kl.detach(),
                **_ratio_metrics(ratio.detach(), ratio_clamped.detach(), mask, gvt),
                **_mismatch_metrics(curr.detach(), prev, gen, mask, gvt, cfg["reference_policy_kl_type"]),
                "sampling_importance_ratio": sampling_ratio,
                **is_metrics,
                "positive_nll_loss": nll.detach(),
                "num_valid_samples": data["sample_mask"].detach().float().sum(),
            }
        return loss, metrics


def _ratio_metrics(ratio, ratio_clamped, mask, gvt) -> dict[str, torch.Tensor]:
    metrics = {}
    for name, values in (("probs_ratio", ratio), ("probs_ratio_clamped", ratio_clamped)):
        metrics[name] = masked_mean(values, mask, gvt)
        metrics[f"{name}_min"] = _masked_extreme(values, mask, torch.amin, float("inf"))
        metrics[f"{name}_max"] = _masked_extreme(values, mask, torch.amax, float("-inf"))
    return metrics


def _mismatch_metrics(curr, prev, gen, mask, gvt, kl_type) -> dict[str, torch.Tensor]:
    """How far the generator's log-probs `gen` are from the trainer's `prev`, and the entropy estimate."""
    k3 = KL_ESTIMATORS["k3"]
    log_mixture = torch.log(0.5 * torch.exp(prev) + 0.5 * torch.exp(gen))
    js = 0.5 * k3(prev - log_mixture) + 0.5 * k3(gen - log_mixture)
    return {
        "token_mult_prob_error": masked_mean(torch.exp((gen - prev).abs()), mask, gvt),
        "gen_kl_error": masked_mean(calculate_kl(gen, prev, kl_type, None, None), mask, gvt),
        "policy_kl_error": masked_mean(calculate_kl(prev, gen, kl_type, None, None), mask, gvt),
        "js_divergence_error": masked_mean(js, mask, gvt),
        "approx_entropy": masked_mean(-torch.exp(curr - gen) * curr, mask, gvt),
    }


def _masked_extreme(values: torch.Tensor, mask: torch.Tensor, reduce, empty: float) -> torch.Tensor:
    """`reduce` (amin / amax) of `values` `[B, S-1]` where `mask` is 1, or `empty` (the reduction's
    identity, inf / -inf) where no entry is: a 0-dim tensor, without reading the mask on the host."""
    if values.numel() == 0:
        return torch.tensor(empty, dtype=values.dtype, device=values.device)
    return reduce(torch.where(mask > 0, values, torch.full_like(values, empty)))
