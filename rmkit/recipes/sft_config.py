"""The SFT recipe's config tree (`rmkit sft --config configs/sft.yaml`): `sft.*` (NeMo RL's keys where they
apply), plus the shared `policy.*`, `data.*`, `checkpointing.*` and `logger.*` sections with SFT's
defaults. Unknown keys are errors naming the dotted key (`rmkit.config.load_config(..., tree_type=SFTTree)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rmkit.config import CheckpointingConfig, DataConfig, LoggerConfig, PolicyConfig
from rmkit.errors import ConfigError


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(key, message)


@dataclass
class SFTConfig:
    """The loop (`sft.*`, NeMo RL's `examples/configs/sft.yaml`)."""

    max_num_epochs: int = 1
    """Passes over the training data; the run stops at whichever of this and `max_num_steps` comes first."""
    max_num_steps: int | None = None
    """Optimizer steps (one global batch of sequences each); None: no limit beyond the epochs."""
    val_period: int = 50
    """Validate every this many optimizer steps (0: only at start/end)."""
    val_batches: int | None = None
    """Validate on at most this many batches of `val_global_batch_size` sequences per set; None: all."""
    val_global_batch_size: int = 32
    """Sequences per validation batch."""
    val_micro_batch_size: int = 8
    """Sequences per validation forward pass."""
    val_at_start: bool = True
    """Validate before the first step (the untrained baseline)."""
    val_at_end: bool = True
    """Validate after the last step."""
    seed: int = 42
    """Seeds torch, Python and the batch sampler."""
    only_unmask_final: bool = False
    """Train on the last assistant turn of each conversation only (NeMo RL's key)."""
    assistant_only_loss: bool = True
    """Train on the assistant turns' tokens only (TRL's key); false: on every token of the conversation."""
    sequence_packing: bool = False
    """Padding-free batches: each micro-batch's sequences laid end to end in one row, position ids
    restarting per sequence and attention kept within each (transformers' packed-sequence mask)."""
    log_period: int = 10
    """Write training metrics every this many steps (the progress bar updates every step)."""
    num_sample_generations: int = 4
    """Held-out prompts (the first of each validation set) answered greedily at every validation and written to
    `<log_dir>/samples.jsonl`; 0: none."""
    sample_max_new_tokens: int = 64
    """Longest sample generation, in tokens."""

    def __post_init__(self):
        _check(self.max_num_epochs >= 1, "sft.max_num_epochs", "must be >= 1")
        _check(self.max_num_steps is None or self.max_num_steps >= 1, "sft.max_num_steps", "must be >= 1")
        _check(self.val_period >= 0, "sft.val_period", "must be >= 0")
        _check(self.val_batches is None or self.val_batches >= 1, "sft.val_batches", "must be >= 1 or null")
        _check(self.val_global_batch_size >= 1, "sft.val_global_batch_size", "must be >= 1")
        _check(self.val_micro_batch_size >= 1, "sft.val_micro_batch_size", "must be >= 1")
        _check(self.log_period >= 1, "sft.log_period", "must be >= 1")
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
        from rmkit.data.demonstrations import DEMONSTRATION_FORMATS

        _check(self.format in DEMONSTRATION_FORMATS, "data.format", f"must be one of {', '.join(DEMONSTRATION_FORMATS)}")


@dataclass
class SFTPolicyConfig(PolicyConfig):
    """`policy.*` with SFT's defaults: SmolLM2-135M-Instruct, 32 sequences per step in micro-batches of 4.
    Batch sizes count sequences (conversations), not pairs."""

    model_name: str = "smollm2"
    train_global_batch_size: int = 32
    train_micro_batch_size: int = 4
    max_total_sequence_length: int = 512


@dataclass
class SFTCheckpointingConfig(CheckpointingConfig):
    """`checkpointing.*` with SFT's output directory."""

    checkpoint_dir: str = "results/sft"


@dataclass
class SFTTree:
    """The whole SFT config."""

    sft: SFTConfig = field(default_factory=SFTConfig)
    policy: SFTPolicyConfig = field(default_factory=SFTPolicyConfig)
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    checkpointing: SFTCheckpointingConfig = field(default_factory=SFTCheckpointingConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)

    def __post_init__(self):
        _check(self.policy.reward_model_cfg.reward_model_type == "bradley_terry" and self.policy.reward_model_cfg.num_labels == 1,
               "policy.reward_model_cfg", "does not apply to SFT (a policy has no reward head); remove it")

