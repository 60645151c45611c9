"""Sequence packing: several sequences in one row, for attention kernels that take `cu_seqlens`.

A packed row holds sequences back to back with no padding between them. `position_ids` restart at
0 for each sequence and `cu_seqlens` gives the boundaries (flash-attention's varlen convention), so
a kernel that honours them attends within each sequence only. The reward of sequence i is read at
row position `cu_seqlens[i + 1] - 1` (`last_token_index`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedBatch:
    """`input_ids` `[1, T]`, `position_ids` `[1, T]` (long), `cu_seqlens` `[n + 1]` int32 with
    `cu_seqlens[0] = 0` and `cu_seqlens[-1] = T`."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor

    @property
    def max_seqlen(self) -> int:
        return int((self.cu_seqlens[1:] - self.cu_seqlens[:-1]).max())

    @property
    def last_token_index(self) -> torch.Tensor:
        """`[n]` positions of each sequence's last token in the packed row."""
        return self.cu_seqlens[1:].long() - 1

    def attention_mask_4d(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """`[1, 1, T, T]` additive block-diagonal causal mask (0 allowed, dtype min blocked), for
        kernels without varlen support; quadratic in T, meant for tests and short rows."""
        total = self.input_ids.shape[1]
        seq = torch.repeat_interleave(
            torch.arange(len(self.cu_seqlens) - 1), (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).long()
        )
        allowed = (seq[:, None] == seq[None, :]) & torch.ones(total, total, dtype=torch.bool).tril()
        mask = torch.zeros(total, total, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
        return mask[None, None]


def pack_sequences(sequences: Sequence[Sequence[int]], max_tokens: int) -> PackedBatch:
    """Concatenate `sequences` into one row of at most `max_tokens` tokens (see `plan_packs` to
    group a dataset into rows first)."""
    if not sequences or any(len(s) == 0 for s in sequences):
        raise ValueError("pack_sequences needs at least one sequence, none of them empty")
    total = sum(len(s) for s in sequences)
    if total > max_tokens:
        raise ValueError(f"{len(sequences)} sequences hold {total} tokens, more than max_tokens={max_tokens}")
    lengths = torch.tensor([len(s) for s in sequences])
    cu_seqlens = torch.zeros(len(sequences) + 1, dtype=torch.int32)
    cu_seqlens[1:] = torch.cumsum(lengths, 0)
    input_ids = torch.tensor([t for s in sequences for t in s], dtype=torch.long)[None]
    position_ids = torch.cat([torch.arange(n) for n in lengths.tolist()])[None]
    return PackedBatch(input_ids, position_ids, cu_seqlens)


def plan_packs(lengths: Sequence[int], max_tokens: int, keep_together: int = 1) -> list[list[int]]:
    """Group record indices into rows of at most `max_tokens` tokens, first-fit decreasing.

    `keep_together=2` treats records 2k and 2k+1 as one unit (a pair's chosen and rejected stay in
    the same row, in order), so the interleaved layout survives packing. A unit longer than
    `max_tokens` is an error: truncate or drop it first.
    """
    units = [list(range(i, min(i + keep_together, len(lengths)))) for i in range(0, len(lengths), keep_together)]
    sizes = [sum(lengths[i] for i in unit) for unit in units]
    too_long = [u for u, size in zip(units, sizes) if size > max_tokens]
    if too_long:
        raise ValueError(f"records {too_long[0]} hold more than max_tokens={max_tokens} tokens")
    rows: list[list[int]] = []
    room: list[int] = []
    for u in sorted(range(len(units)), key=lambda u: -sizes[u]):
        slot = next((r for r, free in enumerate(room) if free >= sizes[u]), None)
        if slot is None:
            rows.append([])
            room.append(max_tokens)
            slot = len(rows) - 1
        rows[slot] += units[u]
        room[slot] -= sizes[u]
    return rows
