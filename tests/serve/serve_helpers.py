"""Shared by the serve tests: tiny reward-model directories and a real `rmkit serve` subprocess
(`rmkit.serve.process.ServerProcess`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

from rmkit.serve.process import ServerProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
API_KEY = "test-key-123"
WORDS = ("the a cat dog sat on mat good bad answer question is was very not helpful paris berlin capital "
         "of france germany what hello world yes no").split()
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
)
TEXTS = ["the cat sat on the mat", "a dog", "hello world yes", "what is the capital of france paris",
         "bad answer not helpful", "good answer very helpful", "no", "the capital of germany is berlin"]
CONVERSATIONS = [
    [{"role": "user", "content": "what is the capital of france"}, {"role": "assistant", "content": "paris"}],
    [{"role": "user", "content": "what is the capital of france"}, {"role": "assistant", "content": "berlin"}],
    [{"role": "system", "content": "be helpful"}, {"role": "user", "content": "hello"},
     {"role": "assistant", "content": "hello world"}],
]


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer with BOS added to every text and a chat template (no hub needed)."""
    specials = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
    vocab = {tok: i for i, tok in enumerate(specials + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                        unk_token="<unk>", additional_special_tokens=specials[3:])
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model_dir(path: Path, num_labels: int, seed: int) -> Path:
    """A random 2-layer Llama-style `...ForSequenceClassification` (hidden 32) saved with its tokenizer."""
    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         num_labels=num_labels, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForSequenceClassification(config)
    with torch.no_grad():  # a visible spread of rewards (the default init gives near-zero scores)
        model.score.weight.normal_(0.0, 1.0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


class Server(ServerProcess):
    """`ServerProcess` (a real `python -m rmkit serve` on a free loopback port) as the serve tests start it:
    this checkout's rmkit on PYTHONPATH, one OpenMP thread, the log next to the model directory."""

    def __init__(self, model_dir: Path, *extra: str):
        fd, log_path = tempfile.mkstemp(prefix="server-", suffix=".log", dir=model_dir.parent)
        os.close(fd)
        super().__init__(model_dir, *extra, env={"PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"},
                         log_path=log_path)
