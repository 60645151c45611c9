"""Skip the last encoder layer's work that no reward reads: compute it for the [CLS] position alone.

A BERT-family sequence classifier reads one hidden state per row, the first token's, through its pooler.
In the last layer every other position's attention output, feed-forward block and layer norms are computed
and then dropped (forward), and their gradient is all zeros (backward). That layer's output at position 0
needs every position's keys and values, but only position 0's query, attention output and feed-forward
pass. `first_token_last_layer(model)` runs the last layer that way, with the layer's own modules and the
model's own attention kernel (sdpa or eager, dropout included), so rewards and gradients equal the full
forward's up to float rounding. For MiniLM (6 layers) this removes ~14% of the forward and backward
matmul FLOPs; for a 12-layer BERT ~7%.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch
from transformers import PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert.modeling_bert import eager_attention_forward

# Classifiers whose head reads only the first position of the encoder's output (BERT's pooler, RoBERTa's head).
FIRST_TOKEN_CLASSIFIERS = ("BertForSequenceClassification", "RobertaForSequenceClassification",
                           "XLMRobertaForSequenceClassification")


def _bert_style_last_layer(model: PreTrainedModel) -> torch.nn.Module | None:
    """The last encoder layer when `model` is a first-token classifier with BERT's post-norm layer layout
    (absolute positions, no cross-attention), else None."""
    if type(model).__name__ not in FIRST_TOKEN_CLASSIFIERS:
        return None
    config = model.config
    if config.is_decoder or getattr(config, "add_cross_attention", False):
        return None
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        return None
    encoder = getattr(getattr(model, model.base_model_prefix, None), "encoder", None)
    layers = getattr(encoder, "layer", None)
    if not layers:
        return None
    layer = layers[-1]
    needed = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output",
              "intermediate", "output")
    return layer if all(_has_submodule(layer, name) for name in needed) else None


def _has_submodule(module: torch.nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


def _first_token_forward(layer: torch.nn.Module, hidden_states: torch.Tensor,
                         attention_mask: torch.Tensor | None = None, *args, **kwargs) -> torch.Tensor:
    """BERT's layer forward for position 0 only: `hidden_states [B, S, H]` -> `[B, 1, H]`."""
    attention = layer.attention.self
    batch, length, _ = hidden_states.shape
    heads, head_size = attention.num_attention_heads, attention.attention_head_size
    first = hidden_states[:, :1]
    query = attention.query(first).view(batch, 1, heads, head_size).transpose(1, 2)  # [B, h, 1, d]
    key = attention.key(hidden_states).view(batch, length, heads, head_size).transpose(1, 2)  # [B, h, S, d]
    value = attention.value(hidden_states).view(batch, length, heads, head_size).transpose(1, 2)
    if attention_mask is not None and attention_mask.dim() == 4:
        attention_mask = attention_mask[:, :, :1, :]  # the query row of a [B, 1, S, S] mask
    kernel = ALL_ATTENTION_FUNCTIONS.get_interface(attention.config._attn_implementation, eager_attention_forward)
    context, _ = kernel(attention, query, key, value, attention_mask,
                        dropout=attention.dropout.p if attention.training else 0.0, scaling=attention.scaling)
    attention_output = layer.attention.output(context.reshape(batch, 1, heads * head_size), first)
    return layer.output(layer.intermediate(attention_output), attention_output)


@contextlib.contextmanager
def first_token_last_layer(model: PreTrainedModel) -> Iterator[bool]:
    """Within the block, the last encoder layer of a BERT-family classifier computes position 0 only (the
    encoder's `last_hidden_state` is then `[B, 1, H]`, which is all the classifier reads). Yields whether it
    applies; other models run unchanged. Parameters, state dicts and outputs other than hidden states are
    untouched, so a run that uses it saves the same checkpoints."""
    layer = _bert_style_last_layer(model)
    # Gradient checkpointing recomputes the layer during backward, after this block has restored it.
    if layer is None or (getattr(layer, "gradient_checkpointing", False) and layer.training):
        yield False
        return
    if "forward" in vars(layer):  # already inside such a block
        yield True
        return
    # One bound method per layer, kept: a compiled block (`policy.compile`) guards on the forward it traced, and a
    # new one every step would compile it again every step.
    bound = layer.__dict__.setdefault("_rmkit_first_token_forward", types.MethodType(_first_token_forward, layer))
    layer.forward = bound
    try:
        yield True
    finally:
        del layer.forward  # back to the class's forward
