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
- `loss`: a scalar tensor. `metrics`: detached 0-dim tensors on the loss's device, additive across
  microbatches (already divided by the global counts) except keys ending in `_min` / `_max`, which
  reduce with min / max. Tensors, not Python floats: reading a value is a host-device sync, so the
  caller decides when (once per step, when it logs); `float(metrics["loss"])` reads one.
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
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


Metric = torch.Tensor | float


def reduce_metrics(metrics_list: list[dict[str, Metric]]) -> dict[str, Metric]:
    """Combine the metrics of several microbatches: sum, except `*_min` / `*_max` (min / max).

    Values are 0-dim tensors or Python floats; tensors stay on their device (no host-device sync),
    floats give floats. Infinite `*_min` / `*_max` values (a microbatch with no valid token) are skipped.
    """
    out: dict[str, Metric] = {}
    for metrics in metrics_list:
        for key, value in metrics.items():
            if key not in out:
                out[key] = value
            elif key.endswith("_min"):
                out[key] = _extreme(out[key], value, torch.minimum)
            elif key.endswith("_max"):
                out[key] = _extreme(out[key], value, torch.maximum)
            else:
                out[key] = out[key] + value
    return out


def _extreme(prev: Metric, value: Metric, pick) -> Metric:
    """`pick(prev, value)`, except that an infinite `value` keeps `prev` and an infinite `prev` takes
    `value`. Computed with `torch.where` on the device rather than with Python branches on the values,
    which would each read a device tensor back to the host."""
    device = next((x.device for x in (prev, value) if isinstance(x, torch.Tensor)), None)
    p, v = (torch.as_tensor(x, dtype=None if isinstance(x, torch.Tensor) else torch.float64, device=device)
            for x in (prev, value))
    out = torch.where(v.isinf(), p, torch.where(p.isinf(), v, pick(p, v)))
    return out if device is not None else out.item()
