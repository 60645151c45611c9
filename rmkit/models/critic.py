"""The PPO critic: a decoder sequence classifier whose scalar head is read at every token, not only the last.

`values[b, t]` of the head is V(input_ids[b, :t + 1]), the value of the state after token t (the layout of
`rmkit.losses.value`'s `value_head_output`; `aligned_values` shifts it to the state in which token t is
generated). A bidirectional encoder cannot be a critic: its output at token t has seen the tokens after it.

A critic may carry a constant offset, `config.rmkit_value_offset` (saved with it, 0 when absent): its values are
the head's output minus it. A PPO run sets it on its first rollout (`value.calibrate_offset`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoConfig

from rmkit.errors import ConfigError
from rmkit.models.reward import find_gguf_file, load_reward_model, uses_last_token_pooling
from rmkit.models.setup import model_source
from rmkit.models.shared_prefix import Group, grouped_attention, layout_for, packed_inputs, unshared_layout
from rmkit.wrappers import transformers_model


def is_scalar_classifier(name_or_path: str | Path) -> bool:
    """Whether the checkpoint is a sequence classifier with one output (a reward model's head, kept as the
    critic's); a causal LM or a classifier of several labels is not."""
    gguf_file = find_gguf_file(name_or_path)
    config = AutoConfig.from_pretrained(str(name_or_path), **({"gguf_file": gguf_file} if gguf_file else {}))
    classifier = any(a.endswith("ForSequenceClassification") for a in (config.architectures or []))
    return classifier and config.num_labels == 1


def load_critic(name_or_path: str | Path, dtype: torch.dtype = torch.float32):
    """`(model, tokenizer, kept_head)`: a one-output classifier keeps its head (`kept_head` True: a reward model
    starts the critic); any other checkpoint gets a fresh scalar head on its backbone. Raises ValueError for
    a model that does not read tokens causally (an encoder)."""
    kept_head = is_scalar_classifier(name_or_path)
    model, tokenizer = load_reward_model(name_or_path, num_labels=None if kept_head else 1, dtype=dtype)
    if not uses_last_token_pooling(model):
        raise ValueError(f"{name_or_path} is a {type(model).__name__}, an encoder: its output at a token has seen the "
                         "tokens after it, so it cannot give a value per token. A critic needs a decoder (a causal "
                         "LM, or a reward model trained on one)")
    return model, tokenizer, kept_head


class TokenValues(torch.nn.Module):
    """`forward(input_ids, attention_mask, position_ids, **attention) -> [B, L]` float32: the critic's head at every
    position minus its `value_offset` (`attention`: what the backbone's attention takes besides, `packed_inputs`'
    `rmkit_groups`). The module a training loop calls (and DDP wraps); `self.model` is the transformers
    classifier."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, **attention) -> torch.Tensor:
        reader = transformers_model(self.model)
        backbone = getattr(reader, reader.base_model_prefix)
        hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=False, **attention).last_hidden_state
        return reader.score(hidden).squeeze(-1).float() - value_offset(self.model)


def value_offset(critic: torch.nn.Module) -> float:
    """What `TokenValues` subtracts from the critic's head: `config.rmkit_value_offset`, 0 when it has none."""
    return float(getattr(transformers_model(critic).config, "rmkit_value_offset", 0.0))


def set_value_offset(critic: torch.nn.Module, offset: float) -> None:
    """Make `offset` what `TokenValues` subtracts from the critic's head (kept in its config, so it is exported)."""
    transformers_model(critic).config.rmkit_value_offset = float(offset)


def shared_prefix_values(forward: torch.nn.Module, critic: torch.nn.Module, groups: Sequence[Group],
                         pad_token_id: int, continuations_only: bool = False) -> torch.Tensor:
    """The head's values `[R, S]` of the unshared rows `[prompt, cont_k]` (group by group, right-padded; with
    `continuations_only`, of the rows `[last prompt token, cont_k]`), each prompt computed once and several
    groups packed to a row (`rmkit.models.shared_prefix`). `forward` is `TokenValues` (or DDP around it);
    `critic` the transformers classifier inside (its config says which attention mask it takes)."""
    layout = layout_for(critic)
    inputs = packed_inputs(critic, groups, pad_token_id, layout=layout)
    with grouped_attention(critic, inputs):
        values = forward(**inputs)
    return unshared_layout(values, groups, continuations_only, layout)


def shares_vocabulary(policy_tokenizer, critic_tokenizer) -> bool:
    """Whether every token of the policy's vocabulary has the same id in the critic's (which may add tokens of its
    own, e.g. a reward model's pad token): then the critic reads the policy's token ids as the same text."""
    critic_vocab = critic_tokenizer.get_vocab()
    return all(critic_vocab.get(token) == index for token, index in policy_tokenizer.get_vocab().items())


class ActorCritic(torch.nn.Module):
    """The policy and its critic as one module: one checkpoint (`policy.*` and `critic.*` weights) and one
    optimizer over both; the training loop calls each on its own."""

    def __init__(self, policy: torch.nn.Module, critic: torch.nn.Module):
        super().__init__()
        self.policy = policy
        self.critic = critic


def check_critic_path(name: str, key: str) -> None:
    """A ConfigError naming `key` when `name` (a packaged alias resolved) is neither on disk nor a Hugging Face
    Hub id (`org/name`, no part of it on disk): checked before any model loads."""
    try:
        model_source(name, key)
    except ConfigError as err:
        raise ConfigError(key, f"{err.message} (give a decoder reward model, a causal LM, or null to let rmkit "
                               "choose)") from None
