"""Collate tokenized records into right-padded tensors; preference pairs are interleaved
`[c0, r0, c1, r1, ...]` (chosen at even rows, rejected at odd rows; docs/design.md)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rmkit.data.tokenize import TokenizedExample, TokenizedPair


def pad_right(sequences: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`input_ids` and `attention_mask` `[B, S]`, padded on the right to the longest sequence."""
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        input_ids[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
        attention_mask[row, : len(seq)] = 1
    return input_ids, attention_mask


def collate_pairs(pairs: Sequence[TokenizedPair], pad_token_id: int) -> dict[str, torch.Tensor]:
    """N pairs -> `input_ids` `[2N, S]` and `attention_mask` `[2N, S]` (long, right padding), and
    `pair_targets`' `sample_mask` `[2N]` and `margin` `[N]`."""
    if not pairs:
        raise ValueError("collate_pairs needs at least one pair")
    rows = [ids for pair in pairs for ids in (pair.chosen_ids, pair.rejected_ids)]
    input_ids, attention_mask = pad_right(rows, pad_token_id)
    return {"input_ids": input_ids, "attention_mask": attention_mask, **pair_targets(pairs)}


def pair_targets(pairs: Sequence[TokenizedPair]) -> dict[str, torch.Tensor]:
    """What the preference loss reads besides the rewards of N pairs: `sample_mask` `[2N]` float32
    (1.0 per row) and `margin` `[N]` float32 (0.0 where absent)."""
    return {
        "sample_mask": torch.ones(2 * len(pairs), dtype=torch.float32),
        "margin": torch.tensor([0.0 if p.margin is None else p.margin for p in pairs], dtype=torch.float32),
    }


def collate_regression(examples: Sequence[TokenizedExample], pad_token_id: int) -> dict[str, torch.Tensor]:
    """B examples -> `input_ids`, `attention_mask` `[B, S]`, and `regression_targets`' `labels` `[B, K]`
    and `sample_mask` `[B]`."""
    if not examples:
        raise ValueError("collate_regression needs at least one example")
    input_ids, attention_mask = pad_right([e.input_ids for e in examples], pad_token_id)
    return {"input_ids": input_ids, "attention_mask": attention_mask, **regression_targets(examples)}


def regression_targets(examples: Sequence[TokenizedExample]) -> dict[str, torch.Tensor]:
    """What the regression loss reads besides the rewards of B examples: `labels` `[B, K]` float32
    (-100 = missing) and `sample_mask` `[B]` float32 (1.0 per row)."""
    return {
        "labels": torch.tensor([list(e.labels) for e in examples], dtype=torch.float32),
        "sample_mask": torch.ones(len(examples), dtype=torch.float32),
    }
