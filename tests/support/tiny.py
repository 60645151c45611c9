"""A tiny random decoder reward-model backbone, its word-level tokenizer and learnable preference data.

The preferred response names the prompt's topic word with a "good" word; the rejected one uses a "bad"
word: a signal a 2-layer, hidden-32 model picks up within a few dozen steps.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
)

TOPICS = ["apples", "rivers", "engines", "poems", "clouds", "stones", "trains", "gardens", "lamps", "maps"]
GOOD = ["helpful", "correct", "clear", "kind", "accurate", "careful"]
BAD = ["wrong", "rude", "vague", "false", "lazy", "careless"]
FILLER = [
    "the",
    "a",
    "is",
    "about",
    "answer",
    "question",
    "tell",
    "me",
    "this",
    "here",
    "user",
    "assistant",
    ":",
]
SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]


# config, causal LM and sequence classifier of each decoder family `random_decoder` builds
DECODER_FAMILIES = {"llama": (LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification),
                    "qwen2": (Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification)}  # fmt: skip


def random_decoder(kind: str, *, classifier: bool = False, pad_token_id: int = 0, **config):
    """A seeded random 2-layer, hidden-32 decoder of family `kind` ("llama" or "qwen2") over 64 token ids, in float32:
    a causal LM, or with `classifier` a one-output sequence classifier (a reward model's or a token-value head's)."""
    import torch

    config_type, causal_lm, sequence_classifier = DECODER_FAMILIES[kind]
    torch.manual_seed(0)
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, pad_token_id=pad_token_id, **config)  # fmt: skip
    if classifier:
        return sequence_classifier(config_type(**common, num_labels=1)).float()
    return causal_lm(config_type(**common)).float()


def make_tiny_decoder(directory: Path, seed: int = 0) -> Path:
    """Save a random 2-layer Llama classifier (num_labels 1) and its tokenizer in `directory`."""
    words = SPECIALS + sorted(set(TOPICS + GOOD + BAD + FILLER + ["User", "Assistant"]))
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    import torch

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=0, bos_token_id=2,
        eos_token_id=3, max_position_embeddings=128,
    )  # fmt: skip
    LlamaForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return Path(directory)


def write_pairs(path: Path, n: int, seed: int) -> Path:
    """`n` binary preference records (prompt, chosen, rejected) as JSONL."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            topic = rng.choice(TOPICS)
            filler = " ".join(rng.choice(FILLER) for _ in range(rng.randint(0, 6)))
            prompt = f"tell me about {topic} {filler} "
            chosen = f"the answer about {topic} is {rng.choice(GOOD)} " + " ".join(rng.sample(FILLER, 2))
            rejected = f"the answer about {topic} is {rng.choice(BAD)} " + " ".join(
                rng.sample(FILLER, rng.randint(0, 4))
            )
            f.write(json.dumps({"prompt": prompt, "chosen": chosen, "rejected": rejected}) + "\n")
    return Path(path)
