"""Shared by the serve tests: tiny reward-model directories and a real `rmkit serve` subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A real `python -m rmkit serve` subprocess on a free loopback port."""

    def __init__(self, model_dir: Path, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(model_dir.parent / f"server-{self.port}.log", "w+")  # noqa: SIM115
        cmd = [sys.executable, "-m", "rmkit", "serve", "--model", str(model_dir), "--port", str(self.port),
               "--log-level", "warning", *extra]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 90.0) -> Server:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.output()}")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
