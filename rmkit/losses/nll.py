"""Token-level negative log-likelihood (SFT), and the per-sample form DPO uses."""

from __future__ import annotations

from typing import Any

import torch

from rmkit.losses.logprobs import next_token_logprobs
from rmkit.losses.masking import compute_dtype, masked_mean


def loss_token_mask(data: dict[str, Any], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`[B, S-1]` mask of the tokens a loss trains on: `token_mask[:, 1:] * sample_mask[:, None]`."""
    token_mask = data["token_mask"][:, 1:].to(dtype)
    return token_mask * data["sample_mask"].to(dtype)[:, None]


class NLLLoss:
    """Negative log-likelihood of `input_ids[:, 1:]` under `next_token_logits[:, :-1]`.

    Called as `loss_fn(next_token_logits [B, S, V], data, global_valid_seqs, global_valid_toks,
    dpo_loss=False, dpo_average_log_probs=False)` with `data` holding `input_ids [B, S]`,
    `token_mask [B, S]` (aligned with input_ids; position 0 ignored) and `sample_mask [B]`.

    - default: the masked sum of token NLLs divided by `global_valid_toks` (a scalar).
    - `dpo_loss=True`: the per-sample NLL vector `[B]` (summed over tokens, or averaged with
      `dpo_average_log_probs=True`), not normalized globally, as NeMo RL's DPO uses it.

    Metrics: `loss` (scalar form only), `num_unmasked_tokens`, `num_valid_samples` (this microbatch).
    `metric_normalizations` says which global count each was divided by, as NeMo RL advertises it:
    `loss` "tokens" (global_valid_toks), the two counts "none".

    `inplace_backward=True` computes the log-probs with `next_token_logprobs(..., inplace_backward=True)`:
    the backward writes the logits' gradient into the logits' storage (no new `[B, S, V]` buffer).
    """

    def __init__(self, inplace_backward: bool = False):
        self.inplace_backward = inplace_backward
        self.metric_normalizations = {"loss": "tokens", "num_unmasked_tokens": "none", "num_valid_samples": "none"}

    def __call__(
        self,
        next_token_logits: torch.Tensor,
        data: dict[str, Any],
        global_valid_seqs: torch.Tensor | float | None,
        global_valid_toks: torch.Tensor | float | None,
        dpo_loss: bool = False,
        dpo_average_log_probs: bool = False,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logprobs = next_token_logprobs(next_token_logits, data["input_ids"], inplace_backward=self.inplace_backward)
        mask = loss_token_mask(data, compute_dtype(logprobs))
        metrics = {
            "num_unmasked_tokens": mask.sum().detach(),
            "num_valid_samples": data["sample_mask"].detach().float().sum(),
        }
        if dpo_loss:
            loss = -(logprobs * mask).sum(-1)
            if dpo_average_log_probs:
                loss = loss / mask.sum(-1).clamp(min=1)
            return loss, metrics
        if global_valid_toks is None:
            raise ValueError("NLLLoss needs global_valid_toks unless dpo_loss=True")
        loss = -masked_mean(logprobs, mask, global_valid_toks)
        return loss, {"loss": loss.detach(), **metrics}
