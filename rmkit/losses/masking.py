"""Masked reductions and the global counts of the LossFunction protocol."""

from __future__ import annotations

import torch


def compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype losses compute in: float64 for float64 inputs (exact tests), else float32."""
    return torch.float64 if tensor.dtype == torch.float64 else torch.float32


def masked_mean(
    values: torch.Tensor,
    mask: torch.Tensor,
    global_normalization_factor: torch.Tensor | float | None = None,
    dim: int | None = None,
) -> torch.Tensor:
    """`sum(values * mask) / factor`, where factor is the mask's own sum unless a global one is given.

    Args:
        values: any shape, e.g. `[B, S-1]` per-token values.
        mask: broadcastable to `values`; 1 where the entry counts.
        global_normalization_factor: the count over the global batch (every microbatch and rank), so
            that microbatch results add up to the full-batch mean. None: this mask's own count.
        dim: reduce along this dimension only (local normalization; the global factor must be None).

    A zero count gives 0 (its numerator is 0 too), never NaN.
    """
    masked = values * mask
    if global_normalization_factor is None:
        count = torch.broadcast_to(mask, masked.shape).to(masked.dtype)
        count = count.sum(dim=dim) if dim is not None else count.sum()
        total = masked.sum(dim=dim) if dim is not None else masked.sum()
        return total / torch.where(count > 0, count, torch.ones_like(count))
    if dim is not None:
        raise ValueError("masked_mean: pass either dim or global_normalization_factor, not both")
    factor = torch.as_tensor(global_normalization_factor, dtype=masked.dtype, device=masked.device)
    return masked.sum() / torch.where(factor > 0, factor, torch.ones_like(factor))


def valid_counts(
    sample_mask: torch.Tensor, token_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """This microbatch's contribution to `(global_valid_seqs, global_valid_toks)`.

    Args:
        sample_mask: `[B]`.
        token_mask: `[B, S]`, aligned with `input_ids` (position 0 is not counted), or None.

    Sum these over every microbatch (and all-reduce over ranks) before calling the losses.
    """
    seqs = sample_mask.sum()
    if token_mask is None:
        return seqs, None
    toks = (token_mask[:, 1:] * sample_mask[:, None]).sum()
    return seqs, toks
