"""A process reward model's step scores out of a sequence classifier, the same way in training and in scoring.

Step k of a solution scores as the classifier of its prefix: the problem and steps 1..k, each followed by the
separator, read where the classifier reads (`rmkit.data.step_tokenize` lays the prefix out).

- A decoder reads its last token, and its output at a position has seen only the tokens up to it, so one pass over
  the whole solution gives every prefix's score: the head at every step's separator (`TokenValues`).
- An encoder pools its first token ([CLS]) over the whole row: its output at a step's separator has seen the
  steps after it. Each step is scored as a row of its own, the solution cut after the step's separator
  (`rmkit.data.step_tokenize.prefix_rows`), through `PrefixValues`: one pass per step, so an encoder costs about
  (steps per solution) / 2 times a decoder's tokens.
"""

from __future__ import annotations

import torch

from rmkit.models.critic import TokenValues
from rmkit.models.reward import compute_rewards, uses_last_token_pooling


class PrefixValues(torch.nn.Module):
    """`forward(input_ids, attention_mask) -> [B, S]` float32: each row's pooled classifier output (an encoder's
    [CLS]) at every position of the row; a prefix row carries its one label at its last token. `self.model` is the
    transformers classifier."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        pooled = compute_rewards(self.model, input_ids, attention_mask)[:, :1].float()
        return pooled.expand(-1, input_ids.shape[1])


def step_values(model: torch.nn.Module) -> torch.nn.Module:
    """The module a process reward model's training and scoring call: `TokenValues` for a decoder (every position
    of a whole solution), `PrefixValues` for an encoder (one prefix row per step)."""
    return TokenValues(model) if uses_last_token_pooling(model) else PrefixValues(model)


def scores_each_prefix(model: torch.nn.Module) -> bool:
    """Whether `model` needs a row per step (an encoder) rather than one row per solution (a decoder)."""
    return not uses_last_token_pooling(model)
