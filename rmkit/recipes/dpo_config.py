"""The `rmkit dpo` config tree: the loop section `dpo.*` (NeMo RL's `examples/configs/dpo.yaml` keys: the loop's
and the DPO loss's, `rmkit.losses.configs.DPOLossConfig`) and the shared `policy.*`, `data.*`,
`checkpointing.*`, `logger.*` sections with DPO's defaults as default values.

    cfg = load_config("configs/dpo.yaml", ["dpo.max_num_steps=10"], tree_type=DPOTree)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rmkit.config import (
    CheckpointingConfig,
    DataConfig,
    LoggerConfig,
    LoopConfig,
    OptimizerConfig,
    PolicyConfig,
    SchedulerConfig,
    _check,
)
from rmkit.losses.configs import DPOLossConfig


@dataclass
class DPOLoopConfig(DPOLossConfig, LoopConfig):
    """The loop and the loss (`dpo.*`)."""

    section: ClassVar[str] = "dpo"

    val_batches: int | None = 8
    """Validate on at most this many batches of `val_global_batch_size` pairs per set; None: all."""
    val_global_batch_size: int = 8
    """Pairs per validation batch."""
    val_micro_batch_size: int = 1
    """Pairs per validation forward pass."""
    num_sample_generations: int = 4
    """Greedy completions written to `<log_dir>/samples.jsonl` at every validation, for the first prompts
    of the first validation set (0: none)."""
    sample_max_new_tokens: int = 64
    """Longest sample completion, in tokens."""

    def __post_init__(self):
        LoopConfig.__post_init__(self)
        DPOLossConfig.__post_init__(self)
        _check(self.val_batches is None or self.val_batches >= 1, "dpo.val_batches", "must be >= 1 or null")
        _check(self.val_global_batch_size >= 1, "dpo.val_global_batch_size", "must be >= 1")
        _check(self.val_micro_batch_size >= 1, "dpo.val_micro_batch_size", "must be >= 1")
        _check(self.reference_policy_kl_penalty > 0, "dpo.reference_policy_kl_penalty", "must be > 0")
        _check(self.num_sample_generations >= 0, "dpo.num_sample_generations", "must be >= 0")
        _check(self.sample_max_new_tokens >= 1, "dpo.sample_max_new_tokens", "must be >= 1")


@dataclass
class DPOTree:
    """The whole `rmkit dpo` config, with NeMo RL's DPO defaults. `dpo.*`: at most 150 steps, validation every 25
    steps and at the start (the policy equals the reference there: loss ln 2) but not at the end (a run with
    validation data and no earlier validation validates at the end anyway), metrics every step. `policy.*`: SmolLM2-135M-Instruct (the policy and its reference), 16 pairs
    per step in micro-batches of 2 (also per reference forward), 512 tokens, NeMo RL's DPO optimizer (AdamW lr
    5e-6, weight decay 0.1, betas 0.9/0.98, eps 1e-5) and schedule (20 warmup steps, then constant).
    `checkpointing.*`: `results/dpo` (the policy goes to `final/`, the reference log-probs to
    `reference_logprobs/`), a checkpoint every 50 steps."""

    dpo: DPOLoopConfig = field(default_factory=lambda: DPOLoopConfig(
        max_num_steps=150, val_period=25, val_at_end=False, log_period=1))
    policy: PolicyConfig = field(default_factory=lambda: PolicyConfig(
        model_name="smollm2", train_global_batch_size=16, train_micro_batch_size=2, max_total_sequence_length=512,
        optimizer=OptimizerConfig(lr=5e-6, weight_decay=0.1, betas=(0.9, 0.98), eps=1e-5),
        scheduler=SchedulerConfig(name="constant", warmup_steps=20)))
    data: DataConfig = field(default_factory=DataConfig)
    checkpointing: CheckpointingConfig = field(default_factory=lambda: CheckpointingConfig(
        checkpoint_dir="results/dpo", save_period=50))
    logger: LoggerConfig = field(default_factory=LoggerConfig)

    def __post_init__(self):
        _check(not self.policy.compile, "policy.compile", "not supported by rmkit dpo yet; set policy.compile=false")
