"""The LossFunction protocol (NeMo RL's), shared by every loss in `rmkit.losses`.

A loss is a callable `loss_fn(next_token_logits, data, global_valid_seqs, global_valid_toks)` that
returns `(loss, metrics)`:

- `next_token_logits` `[B, S, V]`: position t predicts `data["input_ids"][:, t+1]` (reward losses take
  the reward head's output here instead).
- `data`: a plain dict of tensors with NeMo RL's keys (`input_ids`, `token_mask`, `sample_mask`,
  `advantages`, `prev_logprobs`, `generation_logprobs`, `reference_policy_logprobs`, ...). Per-token
  tensors are `[B, S]` and aligned with `input_ids` (position 0 carries no log-prob).
- `global_valid_seqs` / `global_valid_toks`: the number of valid sequences (sum of `sample_mask`) and
  valid tokens (sum of `token_mask[:, 1:] * sample_mask[:, None]`) over the whole global batch, every
  microbatch and every data-parallel rank. Dividing by these makes microbatch losses add up exactly to
  the full-batch loss.
- `loss`: a scalar tensor. `metrics`: Python floats, additive across microbatches (already divided by
  the global counts) except keys ending in `_min` / `_max`, which reduce with min / max.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class LossFunction(Protocol):
    """Signature every rmkit loss follows; see the module docstring."""

    def __call__(
        self,
        next_token_logits: torch.Tensor,
        data: dict[str, Any],
        global_valid_seqs: torch.Tensor | float,
        global_valid_toks: torch.Tensor | float | None,
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


def reduce_metrics(metrics_list: list[dict[str, float]]) -> dict[str, float]:
    """Combine the metrics of several microbatches: sum, except `*_min` / `*_max` (min / max).

    Infinite `*_min` / `*_max` values (a microbatch with no valid token) are skipped.
    """
    out: dict[str, float] = {}
    for metrics in metrics_list:
        for key, value in metrics.items():
            value = float(value)
            if key.endswith("_min") or key.endswith("_max"):
                if value in (float("inf"), float("-inf")):
                    out.setdefault(key, value)
                    continue
                pick = min if key.endswith("_min") else max
                prev = out.get(key)
                out[key] = (
                    value if prev is None or prev in (float("inf"), float("-inf")) else pick(prev, value)
                )
            else:
                out[key] = out.get(key, 0.0) + value
    return out
