"""Tiny models and prompt files for the GRPO tests (built once per session, no downloads)."""

import json
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_reward_model(tmp_path_factory) -> str:
    """A random Llama classifier (hidden 16, 1 layer, num_labels 1) with SmolLM2's tokenizer and chat template:
    it reads a conversation through its own template, as the inference core does for any reward model."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from rmkit.models.reward import load_tokenizer
    from rmkit.models.setup import resolve_model_name

    tokenizer = load_tokenizer(resolve_model_name("smollm2"))
    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         pad_token_id=tokenizer.pad_token_id, num_labels=1)
    path = tmp_path_factory.mktemp("tiny_reward_model")
    LlamaForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def write_prompts(path: Path, n: int, offset: int = 0) -> Path:
    with open(path, "w", encoding="utf-8") as out:
        for i in range(offset, offset + n):
            record = {"prompt": f"Say something about the number {i}."} if i % 2 else \
                {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Count to {i}."}]}
            out.write(json.dumps(record) + "\n")
    return path


@pytest.fixture
def prompt_files(tmp_path) -> tuple[Path, Path]:
    return write_prompts(tmp_path / "train.jsonl", 16), write_prompts(tmp_path / "val.jsonl", 4, offset=100)


def grpo_overrides(policy: str, reward_model: str, train: Path, val: Path, out: Path, steps: int = 2) -> list[str]:
    """A tiny, fast GRPO run: 4 prompts x 2 completions of 6 tokens, two optimizer steps per rollout."""
    return [f"policy.model_name={policy}", f"env.reward_model.model_name={reward_model}",
            f"data.train_data_path={train}", f"data.val_data_paths={{val: {val}}}",
            f"checkpointing.checkpoint_dir={out}", f"grpo.max_num_steps={steps}", "grpo.num_prompts_per_step=4",
            "grpo.num_generations_per_prompt=2", "grpo.val_period=0", "grpo.max_val_samples=4",
            "policy.train_global_batch_size=4", "policy.train_micro_batch_size=2", "policy.generation.max_new_tokens=6",
            "policy.max_total_sequence_length=128", "policy.optimizer.lr=1e-3", "policy.num_threads=1",
            "logger.tensorboard=false", "logger.progress_bar=false"]


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread: the tiny models gain nothing from more, and the test machine is shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def ppo_overrides(policy: str, reward_model: str, train: Path, val: Path, out: Path, steps: int = 2) -> list[str]:
    """A tiny, fast PPO run: GRPO's tiny layout (4 prompts x 2 completions, two optimizer steps per pass) with two
    PPO epochs; the critic starts from the tiny reward model (same tokenizer as the policy)."""
    return [arg.replace("grpo.", "ppo.") for arg in grpo_overrides(policy, reward_model, train, val, out, steps)] + [
        "ppo.ppo_epochs=2", "value.optimizer.lr=1e-3", "value.train_micro_batch_size=1"]


@pytest.fixture
def logprob_passes(monkeypatch) -> list:
    """A list that gets one entry per `batch_logprobs` pass of GRPO or PPO: a recipe's own (`prev_logprobs`) or
    the reference's (`rmkit.rl.logprobs.reference_logprobs`)."""
    from rmkit.recipes import grpo, ppo
    from rmkit.rl import logprobs

    passes, real = [], logprobs.batch_logprobs

    def counted(*args, **kwargs):
        passes.append(1)
        return real(*args, **kwargs)

    for module in (grpo, ppo, logprobs):
        monkeypatch.setattr(module, "batch_logprobs", counted)
    return passes
