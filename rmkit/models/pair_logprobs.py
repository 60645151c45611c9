"""The policy's next-token logits of a batch of preference pairs, laid out as the DPO loss reads them.

A batch of N `PolicyPair`s becomes 2N interleaved rows `[c0, r0, c1, r1, ...]` (docs/design.md): the rows
`prompt_ids + chosen_ids` and `prompt_ids + rejected_ids`, each from its prompt's last token on (the positions
whose logits predict a response token: `[prompt_ids[-1], *chosen_ids]`), padded on the right, with
`token_mask` 1 on the response tokens (the ones DPO scores). `PairLogits` is the one place that runs the policy
over pairs: DPO's training step, its validation and the reference pass (`rmkit.trainer.reference_logprobs`)
all call it. It runs each pair as `[prompt, chosen, rejected]` with the prompt computed once, several pairs
packed to a row (`rmkit.models.shared_prefix`); the logits equal the two unshared rows' within float rounding,
and the output layer runs at the response positions only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rmkit.data.policy_tokenize import PolicyPair
from rmkit.models.setup import autocast
from rmkit.models.shared_prefix import shared_prefix_logits

RefLogprobs = tuple[torch.Tensor, torch.Tensor]
"""A pair's reference log-probs of its response tokens: chosen `[len(chosen_ids)]`, rejected `[len(rejected_ids)]`."""

PLACEHOLDER = PolicyPair([0], [0], [0], "placeholder")
"""A one-token pair standing in for a rank's empty share of a batch (its rows get sample_mask 0)."""


def pair_rows(pairs: Sequence[PolicyPair]) -> list[list[int]]:
    """The 2N token rows of `pairs` from each prompt's last token on, interleaved `[c0, r0, c1, r1, ...]`."""
    return [pair.prompt_ids[-1:] + side for pair in pairs for side in (pair.chosen_ids, pair.rejected_ids)]


def response_start(pair: PolicyPair) -> int:
    """Where the responses begin in the pair's rows (`pair_rows`): after the prompt's last token, or at 0."""
    return len(pair.prompt_ids[-1:])


def pair_batch(pairs: Sequence[PolicyPair], pad_token_id: int, device: torch.device | None = None) -> dict:
    """The loss's `data` for `pairs`: `input_ids`, `attention_mask`, `token_mask` `[2N, S]` of `pair_rows` (S
    the longest; right padding) and `sample_mask` `[2N]` (every row counts)."""
    rows = pair_rows(pairs)
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    token_mask = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, row in enumerate(rows):
        input_ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[i, :len(row)] = 1
        # Response tokens; position 0 never carries a log-prob (an empty prompt leaves the first token out).
        token_mask[i, 1:len(row)] = 1
    data = {"input_ids": input_ids, "attention_mask": attention_mask, "token_mask": token_mask,
            "sample_mask": torch.ones(len(rows), dtype=torch.float32)}
    return {k: v.to(device) for k, v in data.items()} if device is not None else data


class PairLogits(torch.nn.Module):
    """`forward(pairs) -> (next_token_logits [2N, S, V], data)`: the policy over a batch of pairs (one forward
    call, what DDP wraps: one forward per backward). `data` is `pair_batch(pairs)` on the model's device."""

    def __init__(self, model: torch.nn.Module, pad_token_id: int, precision: str):
        super().__init__()
        self.model = model
        self.pad_token_id = pad_token_id
        self.precision = precision

    def forward(self, pairs: Sequence[PolicyPair]) -> tuple[torch.Tensor, dict]:
        device = next(self.model.parameters()).device
        data = pair_batch(pairs, self.pad_token_id, device)
        groups = [(pair.prompt_ids, (pair.chosen_ids, pair.rejected_ids)) for pair in pairs]
        with autocast(self.precision, device):
            logits = shared_prefix_logits(self.model, groups, self.pad_token_id, continuations_only=True)
        return logits, data


def reference_tensor(refs: Sequence[RefLogprobs], pairs: Sequence[PolicyPair], data: dict) -> torch.Tensor:
    """`reference_policy_logprobs` `[2N, S]` aligned with `data["input_ids"]`: each pair's cached response
    log-probs at its response positions, 0 elsewhere (outside `token_mask`, which the loss ignores)."""
    out = torch.zeros(data["input_ids"].shape, dtype=torch.float32)
    for i, (pair, (chosen, rejected)) in enumerate(zip(pairs, refs)):
        start = response_start(pair)
        out[2 * i, start:start + len(chosen)] = chosen
        out[2 * i + 1, start:start + len(rejected)] = rejected
    return out.to(data["input_ids"].device)
