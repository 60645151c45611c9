"""What the RL recipes' policy updates share: the clipped-token share the loss itself does not report, and the
loss metrics of several optimizer steps of one rollout reduced to one number each."""

from __future__ import annotations

import torch

from rmkit import distributed as dist
from rmkit.losses.logprobs import next_token_logprobs


@torch.no_grad()
def clipped_fraction(loss_cfg, logits: torch.Tensor, mb: dict, gvt: torch.Tensor) -> torch.Tensor:
    """The share of the global batch's tokens whose ratio exp(curr - prev) fell outside the clip range of
    `loss_cfg` (`loss_fn.*`)."""
    if loss_cfg.disable_ppo_ratio:
        return torch.zeros((), device=logits.device)
    ratio = torch.exp(next_token_logprobs(logits, mb["input_ids"]) - mb["prev_logprobs"][:, 1:])
    out = (ratio < 1 - loss_cfg.ratio_clip_min) | (ratio > 1 + loss_cfg.ratio_clip_max)
    mask = mb["token_mask"][:, 1:] * mb["sample_mask"][:, None]
    return (out.float() * mask).sum() / gvt.clamp(min=1)


def mean_over_updates(steps: list[dict], prefix: str = "train/") -> dict[str, float]:
    """Each metric of a rollout's optimizer steps (one dict per step, this rank's micro-batches reduced) as one
    number named `<prefix><key>`: `_min` / `_max` the extreme over steps and ranks, `lr` and `grad_norm` the
    mean over steps, the rest (each rank holds its part of a globally normalized value) the mean over steps of
    the sum over ranks."""
    out = {}
    for key in steps[0]:
        values = torch.stack([torch.as_tensor(s[key], dtype=torch.float64).cpu() for s in steps])
        if key.endswith(("_min", "_max")):  # the reduction over ranks too
            value = dist.all_reduce(values.amin() if key.endswith("_min") else values.amax(), key[-3:])
        elif key in ("lr", "grad_norm"):
            value = values.mean()
        else:  # each rank holds its part of the globally normalized value
            value = dist.all_reduce_sum(values.mean())
        out[f"{prefix}{key}"] = float(value)
    return out
