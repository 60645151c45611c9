"""The interleaved pair layout of docs/design.md: chosen at even rows, rejected at odd rows."""

import torch

from rmkit.data.collate import collate_pairs, collate_regression
from rmkit.data.tokenize import TokenizedExample, TokenizedPair


def test_collate_pairs_interleaves_and_pads_right():
    pairs = [TokenizedPair([1, 2, 3], [4, 5], 0.5, "a"), TokenizedPair([6], [7, 8, 9, 10], None, "b")]
    batch = collate_pairs(pairs, pad_token_id=0)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 0], [4, 5, 0, 0], [6, 0, 0, 0], [7, 8, 9, 10]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert batch["sample_mask"].dtype == torch.float32 and batch["sample_mask"].tolist() == [1.0] * 4
    assert batch["margin"].dtype == torch.float32 and batch["margin"].tolist() == [0.5, 0.0]


def test_collate_regression():
    batch = collate_regression([TokenizedExample([1, 2], (1.0, -100.0)), TokenizedExample([3], (0.5, 2.0))], 9)
    assert batch["input_ids"].tolist() == [[1, 2], [3, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1], [1, 0]]
    assert batch["labels"].tolist() == [[1.0, -100.0], [0.5, 2.0]]
    assert batch["sample_mask"].tolist() == [1.0, 1.0]
