"""Direct Preference Optimization with an optional SFT term (https://arxiv.org/abs/2305.18290)."""

from __future__ import annotations

from typing import Any

import torch

from rmkit.losses.configs import DPOLossConfig, validate_dpo
from rmkit.losses.logprobs import next_token_logprobs
from rmkit.losses.masking import masked_mean
from rmkit.losses.nll import loss_token_mask
from rmkit.losses.preference import preference_terms, split_pairs


class DPOLossFn:
    """DPO loss `w_p * L_pref + w_s * L_sft` over interleaved rows `[c0, r0, c1, r1, ...]`.

    Implicit reward of a row: `r = sum_t (logp_t - ref_logp_t) * mask_t` (token mean with
    `preference_average_log_probs`), with `logp` from `next_token_logits` and `ref_logp` from
    `data["reference_policy_logprobs"]` `[B, S]` (aligned with input_ids). `L_pref` is the
    Bradley-Terry loss `-logsigmoid(beta * (r_c - r_r))` over pairs, normalized by
    `global_valid_seqs / 2`; `L_sft` the NLL of the chosen rows (summed, or averaged per sample with
    `sft_average_log_probs`), normalized the same way.

    Data: `input_ids [2N, S]`, `token_mask [2N, S]`, `sample_mask [2N]`, `reference_policy_logprobs
    [2N, S]`. Metrics: `loss`, `sft_loss`, `preference_loss`, `accuracy`, `rewards_chosen_mean`,
    `rewards_rejected_mean` (unscaled implicit rewards), `num_valid_samples` (pairs).

    `inplace_backward=True` computes the log-probs with `next_token_logprobs(..., inplace_backward=True)`:
    the backward writes the logits' gradient into the logits' storage (no new `[B, S, V]` buffer).
    """

    def __init__(self, cfg: dict | DPOLossConfig, inplace_backward: bool = False):
        self.inplace_backward = inplace_backward
        cfg = validate_dpo(cfg)
        self.beta = float(cfg["reference_policy_kl_penalty"])
        self.preference_loss_weight = float(cfg["preference_loss_weight"])
        self.sft_loss_weight = float(cfg["sft_loss_weight"])
        self.preference_average_log_probs = bool(cfg["preference_average_log_probs"])
        self.sft_average_log_probs = bool(cfg["sft_average_log_probs"])

    def __call__(
        self,
        next_token_logits: torch.Tensor,
        data: dict[str, Any],
        global_valid_seqs: torch.Tensor | float,
        global_valid_toks: torch.Tensor | float | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logprobs = next_token_logprobs(next_token_logits, data["input_ids"], inplace_backward=self.inplace_backward)
        token_mask = data["token_mask"][:, 1:].to(logprobs.dtype)
        ref = data["reference_policy_logprobs"][:, 1:].to(logprobs.dtype)
        # where, not a product: padding may hold -inf reference log-probs.
        rewards = torch.where(token_mask > 0, logprobs - ref, torch.zeros_like(logprobs)).sum(-1)
        if self.preference_average_log_probs:
            rewards = rewards / token_mask.sum(-1).clamp(min=1)
        terms = preference_terms(rewards, data["sample_mask"], global_valid_seqs, self.beta)

        nll = -(logprobs * loss_token_mask(data, logprobs.dtype)).sum(-1)
        if self.sft_average_log_probs:
            nll = nll / token_mask.sum(-1).clamp(min=1)
        pairs = torch.as_tensor(global_valid_seqs, dtype=nll.dtype, device=nll.device) / 2
        sft_loss = masked_mean(split_pairs(nll)[0], terms["pair_mask"], pairs)

        loss = self.preference_loss_weight * terms["loss"] + self.sft_loss_weight * sft_loss
        return loss, {
            "loss": loss.detach(),
            "sft_loss": sft_loss.detach(),
            "preference_loss": terms["loss"].detach(),
            "accuracy": terms["accuracy"],
            "rewards_chosen_mean": terms["rewards_chosen_mean"],
            "rewards_rejected_mean": terms["rewards_rejected_mean"],
            "num_valid_samples": terms["num_pairs"].detach(),
        }
