"""Random batches for the loss tests, with the masks and padding of real batches."""

from __future__ import annotations

import torch


def random_batch(batch=4, seq=7, vocab=11, seed=0, dtype=torch.float64, per_seq_advantages=False):
    """A policy batch: logits `[B, S, V]` (a leaf) and NeMo RL data keys aligned with input_ids.

    Row b has a prompt of 1-2 tokens (token_mask 0), then response tokens, then right padding; row 1
    has sample_mask 0. Log-probs near the policy's own (noise 0.3) so PPO ratios straddle the clip
    range; padding positions hold -inf to prove the losses never read them.
    """
    g = torch.Generator().manual_seed(seed)
    logits = (2 * torch.randn(batch, seq, vocab, generator=g, dtype=dtype)).requires_grad_()
    input_ids = torch.randint(0, vocab, (batch, seq), generator=g)
    token_mask = torch.zeros(batch, seq)
    for b in range(batch):
        prompt = 1 + b % 2
        length = seq - (b % 3)
        token_mask[b, prompt:length] = 1
    sample_mask = torch.ones(batch)
    if batch > 1:
        sample_mask[1] = 0
    with torch.no_grad():
        true_lp = (
            torch.log_softmax(logits.double(), -1)[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        )
        true_lp = torch.cat([torch.zeros(batch, 1, dtype=torch.float64), true_lp], dim=1)

    def noisy(scale):
        x = true_lp + scale * torch.randn(batch, seq, generator=g, dtype=torch.float64)
        return torch.where(token_mask > 0, x, torch.full_like(x, float("-inf"))).to(dtype)

    if per_seq_advantages:
        advantages = torch.randn(batch, generator=g, dtype=dtype)
    else:
        advantages = torch.randn(batch, seq, generator=g, dtype=dtype)
    data = {
        "input_ids": input_ids,
        "token_mask": token_mask,
        "sample_mask": sample_mask,
        "advantages": advantages,
        "prev_logprobs": noisy(0.3),
        "generation_logprobs": noisy(0.35),
        "reference_policy_logprobs": noisy(0.5),
    }
    return logits, data


def global_counts(data):
    """(global_valid_seqs, global_valid_toks) of a whole batch."""
    seqs = data["sample_mask"].sum()
    toks = (data["token_mask"][:, 1:] * data["sample_mask"][:, None]).sum()
    return seqs, toks


def split_batch(data, rows):
    """The rows `rows` (a slice or index list) of every tensor in `data`."""
    return {k: v[rows] for k, v in data.items()}
