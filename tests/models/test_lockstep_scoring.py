"""`score_sequences(..., min_forwards=n)`: the padding forwards an FSDP2 model needs (every rank runs as
many forward passes as the busiest, `RewardScorer.score_ids(lockstep=True)`) leave the rewards as they were."""

import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from rmkit.models import score_sequences


def test_extra_forwards_run_and_do_not_change_rewards():
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(LlamaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_labels=1, pad_token_id=0)).eval()  # fmt: skip
    calls = []
    model.model.register_forward_hook(lambda *_: calls.append(1))
    sequences = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    plain = score_sequences(model, sequences, 0, max_batch_tokens=8)  # 2 forwards: the rows of 4 and 3 tokens (2 x 4 <= 8), then the one of 2
    assert len(calls) == 2
    padded = score_sequences(model, sequences, 0, max_batch_tokens=8, min_forwards=5)
    assert len(calls) == 2 + 5
    torch.testing.assert_close(padded, plain, rtol=0, atol=0)  # the same batches: bitwise equal
    assert score_sequences(model, [], 0, min_forwards=2).shape == (0, 1) and len(calls) == 2 + 5 + 2
