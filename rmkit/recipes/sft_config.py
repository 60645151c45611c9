"""The SFT recipe's config tree (`rmkit sft --config configs/sft.yaml`): `sft.*` (NeMo RL's keys where they
apply), plus the shared `policy.*`, `data.*`, `checkpointing.*` and `logger.*` sections with SFT's defaults
as default values. Unknown keys are errors naming the dotted key (`rmkit.config.load_config(...,
tree_type=SFTTree)`); `policy.reward_model_cfg` is one (a policy has no reward head).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rmkit.config import CheckpointingConfig, DataConfig, LoggerConfig, LoopConfig, PolicyConfig, _check


@dataclass
class SFTConfig(LoopConfig):
    """The loop (`sft.*`, NeMo RL's `examples/configs/sft.yaml`)."""

    section: ClassVar[str] = "sft"

    val_batches: int | None = None
    """Validate on at most this many batches of `val_global_batch_size` sequences per set; None: all."""
    val_global_batch_size: int = 32
    """Sequences per validation batch."""
    val_micro_batch_size: int = 8
    """Sequences per validation forward pass."""
    only_unmask_final: bool = False
    """Train on the last assistant turn of each conversation only (NeMo RL's key)."""
    assistant_only_loss: bool = True
    """Train on the assistant turns' tokens only (TRL's key); false: on every token of the conversation."""
    sequence_packing: bool = False
    """Padding-free batches: each micro-batch's sequences laid end to end in one row, position ids
    restarting per sequence and attention kept within each (transformers' packed-sequence mask)."""
    num_sample_generations: int = 4
    """Held-out prompts (the first of each validation set) answered greedily at every validation and written to
    `<log_dir>/samples.jsonl`; 0: none."""
    sample_max_new_tokens: int = 64
    """Longest sample generation, in tokens."""

    def __post_init__(self):
        super().__post_init__()
        _check(self.val_batches is None or self.val_batches >= 1, "sft.val_batches", "must be >= 1 or null")
        _check(self.val_global_batch_size >= 1, "sft.val_global_batch_size", "must be >= 1")
        _check(self.val_micro_batch_size >= 1, "sft.val_micro_batch_size", "must be >= 1")
        _check(self.num_sample_generations >= 0, "sft.num_sample_generations", "must be >= 0")
        _check(self.sample_max_new_tokens >= 1, "sft.sample_max_new_tokens", "must be >= 1")


@dataclass
class SFTDataConfig(DataConfig):
    """`data.*`: the shared data options, plus the demonstration layouts' keys. `format`: auto (sniffed),
    `messages`, `prompt_response`, or a preference format (its chosen side); `default` is the chosen side of
    the preference set that ships with rmkit."""

    messages_key: str = "messages"
    """Field holding a whole conversation (`messages` layout)."""
    response_key: str = "response"
    """Field holding the response (`prompt_response` layout; `completion` reads TRL's prompt-completion)."""

    def __post_init__(self):
        super().__post_init__()
        from rmkit.data.demonstrations import DEMONSTRATION_FORMATS

        _check(self.format in DEMONSTRATION_FORMATS, "data.format", f"must be one of {', '.join(DEMONSTRATION_FORMATS)}")


@dataclass
class SFTTree:
    """The whole SFT config. `policy.*`: SmolLM2-135M-Instruct, 32 sequences (conversations) per step in
    micro-batches of 4."""

    sft: SFTConfig = field(default_factory=SFTConfig)
    policy: PolicyConfig = field(default_factory=lambda: PolicyConfig(
        model_name="smollm2", train_global_batch_size=32, train_micro_batch_size=4, max_total_sequence_length=512))
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    checkpointing: CheckpointingConfig = field(default_factory=lambda: CheckpointingConfig(checkpoint_dir="results/sft"))
    logger: LoggerConfig = field(default_factory=LoggerConfig)
