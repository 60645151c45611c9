"""Load a causal language model as a policy (what DPO, SFT and GRPO train) and get its tokenizer ready.

Any `AutoModelForCausalLM` checkpoint loads: a directory, a hub id, a GGUF directory (transformers
dequantizes it), or a packaged backbone (`smollm2`). Padding is on the right for training (attention masks
say which tokens are real, so pad may equal eos); generation pads prompts on the left itself.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from rmkit import distributed as dist
from rmkit.errors import ConfigError
from rmkit.models.reward import (
    config_architectures,
    find_gguf_file,
    forget_dequantized_gguf,
    load_tokenizer,
    transformers_progress_bars_off,
)


def ensure_policy_pad_token(model: PreTrainedModel, tokenizer) -> None:
    """A tokenizer without a pad token pads with eos (or unk): a policy reads which tokens are real
    from the attention mask, so no new token (and no new embedding row in the exported model) is needed."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
    model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id


def load_policy_model(name_or_path: str | Path, dtype: torch.dtype = torch.float32, chat_template: str | None = None):
    """`(model, tokenizer)`: `name_or_path` as a causal LM in `dtype`, with a pad token."""
    gguf_file = find_gguf_file(name_or_path)
    kwargs = {"dtype": dtype, **({"gguf_file": gguf_file} if gguf_file else {})}
    with transformers_progress_bars_off():
        model = AutoModelForCausalLM.from_pretrained(str(name_or_path), **kwargs)
    if gguf_file:
        forget_dequantized_gguf(model)
    tokenizer = load_tokenizer(name_or_path, chat_template=chat_template)
    ensure_policy_pad_token(model, tokenizer)
    return model, tokenizer


@functools.cache  # once per tokenizer and process (a sharded run loads the policy again to export it)
def warn_plain_prompts(name: str) -> None:
    """Rank 0 says that `name`'s tokenizer has no chat template, and how the policy's prompts are rendered instead."""
    if dist.is_main():
        print(f"rmkit: warning: {name} has no chat template: prompts are rendered as \"User: ...\\nAssistant:\" "
              "(an HH transcript's turns in those roles) and responses follow with EOS; to prompt the policy in its "
              "own format, give a template with policy.tokenizer.chat_template", file=sys.stderr)


def check_not_a_classifier(path: str, key: str) -> None:
    """A ConfigError naming `key` when the model folder `path` holds a sequence classifier (a reward model): loaded as
    a policy it would get a random language-model head."""
    if not (Path(path) / "config.json").is_file():
        return
    try:
        architectures = config_architectures(path)
    except ValueError:
        return  # transformers says what is wrong with it
    classifiers = [a for a in architectures if a.endswith("ForSequenceClassification")]
    if classifiers:
        raise ConfigError(key, f"{path} is a sequence classifier ({classifiers[0]}: a reward model), not a causal "
                               "language model: as a policy its language-model head would be random. Give a causal "
                               "LM (e.g. smollm2, or the final/ of rmkit sft)")


def load_training_policy(policy, device: torch.device):
    """`(model, tokenizer)` for a recipe that trains a policy: `policy.model_name` (a `PolicyConfig`) with its
    tokenizer options, then `prepare_model` (dropout off, freezing, LoRA adapters), on `device`, in train mode."""
    from rmkit.models.setup import loading_errors, model_source, prepare_model, resolve_model_name

    source = model_source(policy.model_name, "policy.model_name")
    check_not_a_classifier(source, "policy.model_name")
    with loading_errors(policy.model_name, "policy.model_name"):
        model, tokenizer = load_policy_model(source,
                                             chat_template=policy.tokenizer.chat_template)
    if policy.tokenizer.name is not None:
        tokenizer = load_tokenizer(resolve_model_name(policy.tokenizer.name), policy.tokenizer.chat_template)
        ensure_policy_pad_token(model, tokenizer)
    if not getattr(tokenizer, "chat_template", None):
        warn_plain_prompts(policy.tokenizer.name or policy.model_name)
    model = prepare_model(model, policy).to(device)
    model.train()
    return model, tokenizer
