"""Applying a token loss to a packed batch: several sequences laid end to end in one row."""

from __future__ import annotations

from typing import Any

import torch

from rmkit.losses.protocol import LossFunction, reduce_metrics


class SequencePackingLossWrapper:
    """Apply `loss_fn` to a packed batch one sequence at a time, with the same global counts.

    Layout of a packed batch of `num_seqs` sequences:
    - `next_token_logits` `[1, T, V]`; sequence i occupies positions
      `[start_i, start_i + len_i)` with `start_i = cu_seqlens_q_padded[i]` (or `cu_seqlens_q[i]`)
      and `len_i = cu_seqlens_q[i+1] - cu_seqlens_q[i]`; positions between sequences are padding.
    - per-token data tensors (`input_ids`, `token_mask`, `prev_logprobs`, ..., `advantages` when per
      token) are either packed, `[1, T, ...]` in the same layout as the logits (a tensor whose first
      two dims are `(1, T)`), or unpacked as NeMo RL passes them, `[num_seqs, S, ...]` with S > 1 and
      row i holding sequence i from position 0 (sequence i gets `row[:len_i]`; where the row is
      shorter than len_i, as when a packer folds alignment fill into the last sequence's length,
      the positions past the row's end are skipped, logits included, as NeMo RL does).
    - per-sequence data tensors (`sample_mask`, `advantages` when per sequence) are `[num_seqs]` or
      `[num_seqs, 1]`; sequence i gets row i. Other values are passed through unchanged.

    Each sequence is handed to `loss_fn` as a batch of one (logits `[1, len_i, V]`); losses are
    summed, metrics summed except `*_min` / `*_max` (min / max, infinities skipped). Because the
    losses divide by the global counts, the result equals `loss_fn` on the padded `[num_seqs, S]`
    batch, values and gradients. Use it with per-sequence losses (NLL, ClippedPG); pairwise losses
    (DPO, preference) need both rows of a pair in one call and are refused.

    Args:
        loss_fn: a LossFunction.
        cu_seqlens_q: `[num_seqs + 1]` int, cumulative true sequence lengths (starts at 0).
        cu_seqlens_q_padded: `[num_seqs + 1]` int, cumulative padded lengths (where sequences start
            in the packed row), or None when sequences are packed without gaps.
    """

    def __init__(
        self,
        loss_fn: LossFunction,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_q_padded: torch.Tensor | None = None,
    ):
        from rmkit.losses.dpo import DPOLossFn
        from rmkit.losses.preference import PreferenceLoss

        if isinstance(loss_fn, (DPOLossFn, PreferenceLoss)):
            raise ValueError(f"SequencePackingLossWrapper cannot split the pairs of {type(loss_fn).__name__}")
        self.loss_fn = loss_fn
        self.lengths = torch.diff(torch.as_tensor(cu_seqlens_q)).tolist()
        padded = cu_seqlens_q if cu_seqlens_q_padded is None else cu_seqlens_q_padded
        self.starts = torch.as_tensor(padded)[:-1].tolist()
        if len(self.starts) != len(self.lengths):
            raise ValueError("cu_seqlens_q and cu_seqlens_q_padded must have the same length")
        padded_lengths = torch.diff(torch.as_tensor(padded)).tolist()
        if any(n < 0 or p < n for n, p in zip(self.lengths, padded_lengths)):
            raise ValueError("each padded length must be >= its sequence length (>= 0)")

    def _slice(self, key: str, value: Any, i: int, total: int) -> Any:
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            return value
        start, length = self.starts[i], self.lengths[i]
        if value.dim() >= 2 and value.shape[0] == 1 and value.shape[1] == total:
            return value[:, start : start + length]
        if value.shape[0] == len(self.lengths):
            if value.dim() == 1 or value.shape[1] == 1:
                return value[i : i + 1]
            return value[i : i + 1, :length]  # unpacked per-token rows (NeMo RL's layout)
        raise ValueError(
            f"packed data[{key!r}] has shape {tuple(value.shape)}: expected [1, {total}, ...] per token "
            f"(packed), [{len(self.lengths)}, S, ...] per token (unpacked) or [{len(self.lengths)}] per sequence"
        )

    def _split(self, next_token_logits: torch.Tensor) -> list[torch.Tensor]:
        """Each sequence's logits, `[1, len_i, V]`, from one `split` of the packed row: its backward
        assembles one gradient of the row, where a slice per sequence would allocate one each."""
        sizes, position = [], 0
        for start, length in zip(self.starts, self.lengths):
            sizes += [start - position, length]
            position = start + length
        sizes.append(next_token_logits.shape[1] - position)
        return list(next_token_logits.split(sizes, dim=1)[1::2])

    def __call__(
        self,
        next_token_logits: torch.Tensor,
        data: dict[str, Any],
        global_valid_seqs: torch.Tensor | float | None,
        global_valid_toks: torch.Tensor | float | None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """`next_token_logits` `[1, T, V]`; see the class docstring for `data`'s layout."""
        total = next_token_logits.shape[1]
        if next_token_logits.shape[0] != 1 or (self.starts and self.starts[-1] + self.lengths[-1] > total):
            raise ValueError(
                f"packed logits must be [1, T, V] with T >= the packed length, got {tuple(next_token_logits.shape)}"
            )
        loss = None
        metrics = []
        for i, logits in enumerate(self._split(next_token_logits)):
            seq_data = {k: self._slice(k, v, i, total) for k, v in data.items()}
            ids = seq_data.get("input_ids")
            if isinstance(ids, torch.Tensor) and ids.dim() == 2 and ids.shape[1] < logits.shape[1]:
                # An unpacked row shorter than its sequence: the packer folded alignment fill into
                # this (last) sequence's length. Those positions are no tokens; NeMo RL skips them too.
                logits = logits[:, : ids.shape[1]]
            seq_loss, seq_metrics = self.loss_fn(logits, seq_data, global_valid_seqs, global_valid_toks)
            loss = seq_loss if loss is None else loss + seq_loss
            metrics.append(seq_metrics)
        if loss is None:
            loss = next_token_logits.sum() * 0.0
        return loss, reduce_metrics(metrics)
