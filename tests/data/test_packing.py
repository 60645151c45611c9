"""Packing: layout of a packed row, and a tiny Llama reading each packed sequence as if alone."""

import pytest
import torch
from transformers import LlamaConfig, LlamaModel

from rmkit.data.packing import pack_sequences, plan_packs


def test_pack_layout():
    packed = pack_sequences([[1, 2, 3], [4, 5], [6]], max_tokens=8)
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 5, 6]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 0]]
    assert packed.cu_seqlens.dtype == torch.int32 and packed.cu_seqlens.tolist() == [0, 3, 5, 6]
    assert packed.last_token_index.tolist() == [2, 4, 5] and packed.max_seqlen == 3
    with pytest.raises(ValueError, match="max_tokens=5"):
        pack_sequences([[1, 2, 3], [4, 5, 6]], max_tokens=5)


def test_packed_forward_matches_separate_forwards():
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaModel(config).eval()
    seqs = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    packed = pack_sequences(seqs, max_tokens=16)
    with torch.no_grad():
        hidden = model(input_ids=packed.input_ids, position_ids=packed.position_ids,
                       attention_mask=packed.attention_mask_4d()).last_hidden_state[0]
        for i, seq in enumerate(seqs):
            alone = model(input_ids=torch.tensor([seq])).last_hidden_state[0]
            start, end = packed.cu_seqlens[i].item(), packed.cu_seqlens[i + 1].item()
            torch.testing.assert_close(hidden[start:end], alone, atol=1e-5, rtol=1e-5)  # fp32 reorderings


def test_plan_packs_fits_and_keeps_pairs_together():
    lengths = [5, 3, 4, 4, 2, 2, 1, 1]
    rows = plan_packs(lengths, max_tokens=10, keep_together=2)
    assert sorted(i for row in rows for i in row) == list(range(8))
    for row in rows:
        assert sum(lengths[i] for i in row) <= 10
        for k in range(0, len(row), 2):
            assert row[k] % 2 == 0 and row[k + 1] == row[k] + 1  # chosen then its rejected
    with pytest.raises(ValueError, match="max_tokens=10"):
        plan_packs([6, 6], max_tokens=10, keep_together=2)
