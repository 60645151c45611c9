"""Load a transformers backbone as a reward model and read its reward.

The reward of a row is the score head applied to the hidden state of the row's last token that the
attention mask marks as real (docs/design.md). Decoder classifiers in transformers pool "the rightmost token
that is not pad_token_id" instead; `ensure_pad_token` gives every decoder a pad token that never ends
a real sequence, so plain `AutoModelForSequenceClassification` reproduces rmkit's rewards on an
exported model. Encoder classifiers (BERT family) keep their own pooler (the [CLS] token).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel
from transformers.utils import logging as hf_logging

from rmkit.models.first_token import first_token_last_layer

PAD_TOKEN = "<|rmkit_pad|>"


def config_architectures(folder: str | Path) -> list[str]:
    """The `architectures` a model folder's `config.json` names (empty when it names none); ValueError when the file
    is not a model config (not JSON, not a mapping)."""
    try:
        return [str(a) for a in json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
                .get("architectures") or []]
    except (ValueError, AttributeError) as err:
        raise ValueError(f"{Path(folder) / 'config.json'} is not a model config: {err}") from None


def find_gguf_file(name_or_path: str | Path) -> str | None:
    """The single `*.gguf` file in a local directory, or None (hub ids and safetensors directories)."""
    path = Path(name_or_path)
    files = sorted(path.glob("*.gguf")) if path.is_dir() else []
    return files[0].name if files else None


@contextlib.contextmanager
def transformers_progress_bars_off() -> Iterator[None]:
    """Within the block transformers shows no progress bars ("Loading weights", "Writing model shards", and the
    GGUF reader's "Converting and de-quantizing GGUF tensors", a plain tqdm that transformers' switch does not
    reach): rmkit loads and saves one small file set at a time, and the bars are noise in its CLI's output."""
    from transformers import modeling_gguf_pytorch_utils as gguf_reader

    was_shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    bar = getattr(gguf_reader, "tqdm", None)
    if bar is not None:
        gguf_reader.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        yield
    finally:
        if bar is not None:
            gguf_reader.tqdm = bar
        if was_shown:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def transformers_warnings_off() -> Iterator[None]:
    """Within the block transformers logs errors only: its load report (a table of the weights a checkpoint lacks
    or does not use) is replaced by `report_loading`'s line."""
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def report_loading(name_or_path: str | Path, model: PreTrainedModel, info: dict) -> None:
    """Say on stderr, in one line each, what a load left out: the score head a backbone gets (expected: a reward
    model's head is trained from scratch), any other weight the checkpoint lacked (a warning: it starts random),
    and the checkpoint's weights the classifier does not use (a causal LM's output layer: expected)."""
    head = getattr(model, "base_model_prefix", "")
    missing = sorted(set(info.get("missing_keys", ())) | {k for k, *_ in info.get("mismatched_keys", ())})
    new_head = [k for k in missing if not k.startswith(head + ".")]
    backbone = [k for k in missing if k.startswith(head + ".")]
    unused = sorted(info.get("unexpected_keys", ()))
    if new_head:
        print(f"rmkit: {name_or_path}: a new score head ({', '.join(new_head)}) starts from random weights, as a "
              "reward model's head does before training", file=sys.stderr)
    if backbone:
        print(f"rmkit: warning: {name_or_path}: {len(backbone)} backbone weights are not in the checkpoint and start "
              f"from random values ({', '.join(backbone[:3])}{', ...' if len(backbone) > 3 else ''})", file=sys.stderr)
    if unused:
        print(f"rmkit: {name_or_path}: {len(unused)} weights of the checkpoint are not used by the classifier "
              f"({', '.join(unused[:3])}{', ...' if len(unused) > 3 else ''})", file=sys.stderr)


def load_tokenizer(name_or_path: str | Path, chat_template: str | None = None):
    """Tokenizer from a directory or hub id (GGUF directories included); `chat_template` overrides."""
    gguf_file = find_gguf_file(name_or_path)
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(str(name_or_path), **kwargs)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.padding_side = "right"
    # rmkit tokenizes whole texts and cuts them to its max length itself (rmkit.data.tokenize); the
    # tokenizer's once-per-process warning that a text exceeds model_max_length ("will result in indexing
    # errors") does not apply, so it is marked as already given.
    tokenizer.deprecation_warnings["sequence-length-is-longer-than-the-specified-maximum"] = True
    return tokenizer


def uses_last_token_pooling(model: PreTrainedModel) -> bool:
    """True for decoder-style classifiers (a `score` head over every position), False for encoders."""
    return hasattr(model, "score") and hasattr(model, model.base_model_prefix)


def ensure_pad_token(model: PreTrainedModel, tokenizer) -> None:
    """Give the tokenizer and model config a pad token that cannot be mistaken for a real last token.

    Encoders keep theirs. A decoder whose pad is missing or equals eos/bos (a real sequence may end
    with eos) gets the tokenizer's unk token when that is distinct, else a new `<|rmkit_pad|>` token;
    the embedding matrix grows by one row, which changes no other token's output.
    """
    special = {tokenizer.eos_token_id, tokenizer.bos_token_id}
    pad = tokenizer.pad_token_id
    needs_new = pad is None or (uses_last_token_pooling(model) and pad in special)
    if needs_new:
        unk = tokenizer.unk_token_id
        if unk is not None and unk not in special:
            tokenizer.pad_token = tokenizer.unk_token
        else:
            tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
            model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    text_config = model.config.get_text_config()
    text_config.pad_token_id = tokenizer.pad_token_id


def forget_dequantized_gguf(model: PreTrainedModel) -> None:
    """A GGUF checkpoint that transformers dequantized on load holds ordinary float weights; drop the
    quantizer it keeps so the model trains, merges and saves (as safetensors) like any other. Packed
    (still quantized) weights are left alone."""
    quantizer = getattr(model, "hf_quantizer", None)
    packed = any(type(p) is not torch.nn.Parameter or not p.is_floating_point() for p in model.parameters())
    if quantizer is None or packed:
        return
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def load_reward_model(
    name_or_path: str | Path,
    num_labels: int | None = None,
    dtype: torch.dtype = torch.float32,
    chat_template: str | None = None,
):
    """Load `(model, tokenizer)` as a sequence classifier with `num_labels` reward outputs.

    `num_labels=None` keeps the checkpoint's own head size (a saved reward model); an integer builds
    a fresh head of that size on a backbone. GGUF directories (one `*.gguf` file) load too.
    """
    gguf_file = find_gguf_file(name_or_path)
    kwargs = {"dtype": dtype}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    if num_labels is not None:
        # A classifier checkpoint with another head size gets a fresh head of the size asked for.
        kwargs.update(num_labels=num_labels, ignore_mismatched_sizes=True)
    with transformers_progress_bars_off(), transformers_warnings_off():
        model, info = AutoModelForSequenceClassification.from_pretrained(str(name_or_path), output_loading_info=True,
                                                                         **kwargs)
    report_loading(name_or_path, model, info)
    if gguf_file:
        forget_dequantized_gguf(model)
    tokenizer = load_tokenizer(name_or_path, chat_template=chat_template)
    ensure_pad_token(model, tokenizer)
    return model, tokenizer


def compute_rewards(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    inputs_embeds: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    read_at: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Rewards `[B, K]` in float32 for right-padded `input_ids` / `attention_mask` `[B, S]`.

    Decoders: the score head on the hidden state at each row's last real token (the head runs on B
    vectors, not on all B x S positions). Encoders: the model's own pooled logits, with a BERT-family
    model's last layer computed at the pooled [CLS] position only (`first_token_last_layer`). `inputs_embeds`
    `[B, S, H]`, when given, are the word embeddings of `input_ids`, already looked up (the model
    then skips its own lookup; positions and token types are added as usual).

    Decoders also take rows that hold several sequences (`rmkit.models.shared_prefix`: a 4D
    `attention_mask`, `position_ids`): `read_at = (row [R], position [R])` names each sequence's last token,
    and the rewards are `[R, K]`, one per sequence.
    """
    inputs = {"input_ids": input_ids} if inputs_embeds is None else {"inputs_embeds": inputs_embeds}
    if not uses_last_token_pooling(model):
        if read_at is not None:
            raise ValueError(f"{type(model).__name__} pools its own [CLS] token: rows of several sequences need a decoder")
        with first_token_last_layer(model):
            return model(**inputs, attention_mask=attention_mask).logits.float()
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(**inputs, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
    if read_at is None:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        last = (positions * attention_mask.to(positions.dtype)).argmax(dim=1)
        read_at = (torch.arange(hidden.shape[0], device=hidden.device), last)
    return model.score(hidden[read_at]).float()
