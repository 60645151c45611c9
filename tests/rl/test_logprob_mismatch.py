"""`mask_logprob_mismatch`: NeMo RL's sequence-level probability error (`compute_and_apply_seq_logprob_error_masking`)
against a loop written from its definition, with the threshold's masking and the metrics over what is left."""

import math

import pytest
import torch

from rmkit.errors import RolloutFailed
from rmkit.rl.rollout import mask_logprob_mismatch


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    token_mask = torch.zeros(5, 7)
    for row, (start, stop) in enumerate([(2, 7), (3, 5), (1, 4), (4, 4), (2, 6)]):  # row 3: no generated token
        token_mask[row, start:stop] = 1
    gen = torch.randn(5, 7, generator=g).clamp(max=0) * token_mask
    prev = gen + 0.3 * torch.randn(5, 7, generator=g) * token_mask
    prev[4] = gen[4] + 2.0 * token_mask[4]  # far off: this one goes over a threshold
    return {"token_mask": token_mask, "sample_mask": torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0]),
            "generation_logprobs": gen, "prev_logprobs": prev}


def _reference(batch):
    """Per completion with a counted token: mean over its tokens of exp(|gen - prev|) (position 0 never counts)."""
    errors = {}
    for row in range(len(batch["sample_mask"])):
        terms = [math.exp(abs(batch["generation_logprobs"][row, t] - batch["prev_logprobs"][row, t]))
                 for t in range(1, batch["token_mask"].shape[1])
                 if batch["token_mask"][row, t] * batch["sample_mask"][row] > 0]
        if terms:
            errors[row] = sum(terms) / len(terms)
    return errors


def test_metrics_only_without_a_threshold():
    batch = _batch()
    errors = _reference(batch)
    metrics = mask_logprob_mismatch(batch, None)
    assert sorted(errors) == [0, 1, 4]
    assert metrics["train/max_seq_mult_prob_error"] == pytest.approx(max(errors.values()), rel=1e-6)
    assert metrics["train/mean_seq_mult_prob_error"] == pytest.approx(sum(errors.values()) / 3, rel=1e-6)
    assert metrics["train/min_seq_mult_prob_error_after_mask"] == pytest.approx(min(errors.values()), rel=1e-6)
    assert metrics["train/num_masked_seqs_by_logprob_error"] == 0
    assert torch.equal(batch["sample_mask"], torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0]))


def test_threshold_takes_completions_out_of_the_update():
    batch = _batch()
    errors = _reference(batch)
    threshold = (errors[4] + max(errors[0], errors[1])) / 2
    metrics = mask_logprob_mismatch(batch, threshold)
    assert torch.equal(batch["sample_mask"], torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0]))
    assert metrics["train/num_masked_seqs_by_logprob_error"] == 1
    assert metrics["train/max_seq_mult_prob_error"] == pytest.approx(errors[4], rel=1e-6)
    assert metrics["train/max_seq_mult_prob_error_after_mask"] == pytest.approx(max(errors[0], errors[1]), rel=1e-6)
    with pytest.raises(RolloutFailed, match="seq_logprob_error_threshold"):
        mask_logprob_mismatch(_batch(), 1.0)  # every completion is over
