"""The padded-token budget per forward pass when a caller gives none: 1,024 on a CPU, 16,384 on an accelerator
(`default_batch_tokens`), read from the device the model is on, and an explicit budget kept as given."""

import torch

from rmkit.inference import load_scorer
from rmkit.models import score_sequences
from rmkit.models.scoring import default_batch_tokens, score_positions
from tests.support.tiny import make_tiny_decoder, random_decoder


def test_the_budget_follows_the_device_type():
    assert default_batch_tokens("cpu") == default_batch_tokens(torch.device("cpu")) == 1024
    assert default_batch_tokens("cuda") == default_batch_tokens("cuda:1") == 16384


def test_a_cpu_model_without_a_budget_scores_1024_padded_tokens_per_forward():
    model = random_decoder("llama", classifier=True).eval()
    calls = []
    model.model.register_forward_hook(lambda *_: calls.append(1))
    sequences = [[(5 + i + j) % 60 + 3 for j in range(100)] for i in range(15)]
    by_default = score_sequences(model, sequences, 0)
    assert len(calls) == 2  # 10 rows of 100 fit 1,024 tokens: two forwards (16,384 would be one)
    one_forward = score_sequences(model, sequences, 0, max_batch_tokens=16384)
    assert len(calls) == 3
    torch.testing.assert_close(by_default, one_forward)  # the budget changes the batches, not the rewards
    positions = [[49, 99]] * len(sequences)
    steps = score_positions(model, sequences, positions, 0)
    assert len(calls) == 5
    torch.testing.assert_close(torch.stack(steps)[:, 1], by_default)  # the last position is the reward's token


def test_the_scorer_takes_its_default_from_the_model_and_keeps_a_given_budget(tmp_path):
    model_dir = make_tiny_decoder(tmp_path / "rm")
    assert load_scorer(model_dir).max_batch_tokens == 1024
    assert load_scorer(model_dir, max_batch_tokens=300).max_batch_tokens == 300
