"""Score many token sequences at once: sorted by length, packed into token-budgeted batches."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from rmkit.data.collate import pad_right
from rmkit.models.reward import compute_rewards, uses_last_token_pooling


def default_batch_tokens(device: str | torch.device) -> int:
    """Padded tokens per forward pass when none is given: 1,024 on a CPU, 16,384 on an accelerator.

    An accelerator needs wide batches to keep busy. On a CPU a wide batch's activations overflow the caches and the
    memory-bound work (attention scores, norms, activations) dominates: on 2 AMD EPYC cores 1,024 tokens scored
    MiniLM pairs 1.1-1.3x and SmolLM2 texts 2.2x as fast as 16,384 did (BENCHMARKS.md, "Scoring: how many tokens
    per forward pass")."""
    return 1024 if torch.device(device).type == "cpu" else 16384


def length_sorted_batches(
    lengths: Sequence[int], max_batch_tokens: int, max_batch_size: int
) -> list[list[int]]:
    """Indices grouped into batches of similar length whose padded size `rows x longest` stays
    within `max_batch_tokens` (a single longer sequence still gets a batch of its own)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    batches: list[list[int]] = []
    for index in order:
        batch = batches[-1] if batches else None
        # Sorted descending, so the first row of a batch is its longest.
        if batch and len(batch) < max_batch_size and (len(batch) + 1) * lengths[batch[0]] <= max_batch_tokens:
            batch.append(index)
        else:
            batches.append([index])
    return batches


def score_sequences(
    model: PreTrainedModel,
    sequences: Sequence[Sequence[int]],
    pad_token_id: int,
    max_batch_tokens: int | None = None,
    max_batch_size: int = 256,
    min_forwards: int = 0,
) -> torch.Tensor:
    """Rewards `[N, K]` (float32, on CPU) for N token sequences, in the order given.

    Batching changes only which rows share a forward pass; each row's reward is read at its own last
    real token, so the result does not depend on `max_batch_tokens` (None: `default_batch_tokens` of the model's
    device) beyond float rounding. At least
    `min_forwards` forward passes run (the extra ones on one pad token, their output dropped): an FSDP2
    model all-gathers in every forward, so every rank must run as many.
    """
    # An FSDP2 model's parameters (DTensor shards) are all-gathered into buffers that training updates in
    # place again: they must not become inference tensors, so no_grad instead of inference_mode there.
    sharded = any(hasattr(p, "full_tensor") for p in model.parameters())
    with torch.no_grad(), torch.inference_mode(not sharded):
        return _score_sequences(model, sequences, pad_token_id, max_batch_tokens, max_batch_size, min_forwards)


def _score_sequences(model, sequences, pad_token_id, max_batch_tokens, max_batch_size, min_forwards):
    device = next(model.parameters()).device
    if max_batch_tokens is None:
        max_batch_tokens = default_batch_tokens(device)
    lengths = [len(s) for s in sequences]
    rewards: list[torch.Tensor | None] = [None] * len(sequences)
    for batch in length_sorted_batches(lengths, max_batch_tokens, max_batch_size):
        input_ids, attention_mask = pad_right([sequences[i] for i in batch], pad_token_id)
        out = compute_rewards(model, input_ids.to(device), attention_mask.to(device)).cpu()
        for row, index in enumerate(batch):
            rewards[index] = out[row]
    for _ in range(min_forwards - len(length_sorted_batches(lengths, max_batch_tokens, max_batch_size))):
        compute_rewards(model, *(t.to(device) for t in pad_right([[pad_token_id]], pad_token_id)))
    return torch.stack(rewards) if rewards else torch.zeros((0, model.config.num_labels))


def score_positions(
    model: PreTrainedModel,
    sequences: Sequence[Sequence[int]],
    positions: Sequence[Sequence[int]],
    pad_token_id: int,
    max_batch_tokens: int | None = None,
    max_batch_size: int = 256,
) -> list[torch.Tensor]:
    """The classifier's outputs `[n_i, K]` (float32, on CPU) of each of N sequences cut after each of its
    `positions[i]`, in order: a process reward model's step scores (`rmkit.models.step_values`). A decoder gives them
    in one pass per sequence (its head at each position has seen only the tokens up to it); an encoder scores each
    prefix as a sequence of its own (`score_sequences`). Batched as `score_sequences`, so a row's scores do not
    depend on what it is batched with beyond float rounding."""
    if not uses_last_token_pooling(model):
        prefixes = [list(sequence[: p + 1]) for sequence, points in zip(sequences, positions) for p in points]
        scores = score_sequences(model, prefixes, pad_token_id, max_batch_tokens, max_batch_size)
        return list(scores.split([len(points) for points in positions]))
    device = next(model.parameters()).device
    if max_batch_tokens is None:
        max_batch_tokens = default_batch_tokens(device)
    out: list[torch.Tensor | None] = [None] * len(sequences)
    with torch.no_grad(), torch.inference_mode():
        for batch in length_sorted_batches([len(s) for s in sequences], max_batch_tokens, max_batch_size):
            input_ids, attention_mask = pad_right([sequences[i] for i in batch], pad_token_id)
            rows = torch.tensor([row for row, i in enumerate(batch) for _ in positions[i]], dtype=torch.long)
            cols = torch.tensor([p for i in batch for p in positions[i]], dtype=torch.long)
            scores = compute_rewards(model, input_ids.to(device), attention_mask.to(device),
                                     read_at=(rows.to(device), cols.to(device))).cpu()
            for index, part in zip(batch, scores.split([len(positions[i]) for i in batch])):
                out[index] = part
    return out
