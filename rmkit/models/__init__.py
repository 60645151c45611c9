"""Backbones loaded as reward models, and the one place a reward is read from a model."""

from rmkit.models.reward import (
    compute_rewards,
    ensure_pad_token,
    load_reward_model,
    load_tokenizer,
    uses_last_token_pooling,
)
from rmkit.models.scoring import score_sequences

__all__ = [
    "compute_rewards",
    "ensure_pad_token",
    "load_reward_model",
    "load_tokenizer",
    "score_sequences",
    "uses_last_token_pooling",
]
