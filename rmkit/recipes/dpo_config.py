"""The `rmkit dpo` config tree: the loop section `dpo.*` (NeMo RL's `examples/configs/dpo.yaml` keys) and the
shared `policy.*`, `data.*`, `checkpointing.*`, `logger.*` sections with DPO's defaults.

    cfg = load_config("configs/dpo.yaml", ["dpo.max_num_steps=10"], tree_type=DPOTree)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rmkit.config import (
    CheckpointingConfig,
    DataConfig,
    LoggerConfig,
    OptimizerConfig,
    PolicyConfig,
    SchedulerConfig,
    _check,
)


@dataclass
class DPOLoopConfig:
    """The loop and the loss (`dpo.*`)."""

    max_num_epochs: int = 1
    """Passes over the training data; the run stops at whichever of this and `max_num_steps` comes first."""
    max_num_steps: int | None = 150
    """Optimizer steps (one global batch of pairs each); None: no limit beyond the epochs."""
    val_period: int = 25
    """Validate every this many optimizer steps (0: only at start/end)."""
    val_batches: int | None = 8
    """Validate on at most this many batches of `val_global_batch_size` pairs per set; None: all."""
    val_global_batch_size: int = 8
    """Pairs per validation batch."""
    val_micro_batch_size: int = 1
    """Pairs per validation forward pass."""
    val_at_start: bool = True
    """Validate before the first step (the policy equals the reference there: loss ln 2)."""
    val_at_end: bool = False
    """Validate after the last step (NeMo RL's default is off; a run with validation data and no earlier
    validation validates at the end anyway)."""
    seed: int = 42
    """Seeds torch, Python and the batch sampler."""
    log_period: int = 1
    """Write training metrics every this many steps (the progress bar updates every step)."""
    reference_policy_kl_penalty: float = 0.05
    """beta: the implicit reward is `beta * (log pi - log pi_ref)` of a response."""
    preference_loss_weight: float = 1.0
    """Weight of the DPO (preference) term."""
    sft_loss_weight: float = 0.0
    """Weight of the NLL of the chosen responses (RPO-style SFT term)."""
    preference_average_log_probs: bool = False
    """The implicit reward uses the mean instead of the sum of the response's token log-ratios."""
    sft_average_log_probs: bool = False
    """The SFT term is each chosen response's mean token NLL instead of its sum."""
    num_sample_generations: int = 4
    """Greedy completions written to `<log_dir>/samples.jsonl` at every validation, for the first prompts
    of the first validation set (0: none)."""
    sample_max_new_tokens: int = 64
    """Longest sample completion, in tokens."""

    def __post_init__(self):
        _check(self.max_num_epochs >= 1, "dpo.max_num_epochs", "must be >= 1")
        _check(self.max_num_steps is None or self.max_num_steps >= 1, "dpo.max_num_steps", "must be >= 1 or null")
        _check(self.val_period >= 0, "dpo.val_period", "must be >= 0")
        _check(self.val_batches is None or self.val_batches >= 1, "dpo.val_batches", "must be >= 1 or null")
        _check(self.val_global_batch_size >= 1, "dpo.val_global_batch_size", "must be >= 1")
        _check(self.val_micro_batch_size >= 1, "dpo.val_micro_batch_size", "must be >= 1")
        _check(self.log_period >= 1, "dpo.log_period", "must be >= 1")
        _check(self.reference_policy_kl_penalty > 0, "dpo.reference_policy_kl_penalty", "must be > 0")
        _check(self.preference_loss_weight >= 0, "dpo.preference_loss_weight", "must be >= 0")
        _check(self.sft_loss_weight >= 0, "dpo.sft_loss_weight", "must be >= 0")
        _check(self.num_sample_generations >= 0, "dpo.num_sample_generations", "must be >= 0")
        _check(self.sample_max_new_tokens >= 1, "dpo.sample_max_new_tokens", "must be >= 1")

    def loss_config(self) -> dict:
        """The `DPOLossFn` config (`rmkit.losses.dpo.DPOLossConfig`)."""
        keys = ("reference_policy_kl_penalty", "preference_loss_weight", "sft_loss_weight",
                "preference_average_log_probs", "sft_average_log_probs")
        return {key: getattr(self, key) for key in keys}


@dataclass
class DPOOptimizerConfig(OptimizerConfig):
    """`policy.optimizer.*` with NeMo RL's DPO defaults (AdamW)."""

    lr: float = 5e-6
    """Peak learning rate (a full fine-tune of the policy)."""
    weight_decay: float = 0.1
    """Decoupled weight decay on matrices."""
    betas: tuple[float, float] = (0.9, 0.98)
    """Adam moment coefficients."""
    eps: float = 1e-5
    """Adam denominator epsilon."""


@dataclass
class DPOSchedulerConfig(SchedulerConfig):
    """`policy.scheduler.*`: NeMo RL's DPO schedule, a linear warmup then a constant learning rate."""

    name: Literal["cosine", "constant"] = "constant"
    """`constant` holds the peak after warmup; `cosine` decays over the run's total steps."""
    warmup_steps: int = 20
    """Linear warmup steps to the peak learning rate."""


@dataclass
class DPOPolicyConfig(PolicyConfig):
    """`policy.*`: the shared policy section, a causal LM here (any `AutoModelForCausalLM`, GGUF too)."""

    model_name: str = "smollm2"
    """The policy (and its reference): a directory (GGUF too), a hub id, or `smollm2` (SmolLM2-135M-Instruct)."""
    train_global_batch_size: int = 16
    """Pairs per optimizer step."""
    train_micro_batch_size: int = 2
    """Pairs per forward/backward (also per reference forward)."""
    max_total_sequence_length: int = 512
    """Prompt + response tokens; longer pairs follow `data.overlong` (`rmkit.data.policy_tokenize`)."""
    optimizer: DPOOptimizerConfig = field(default_factory=DPOOptimizerConfig)
    """AdamW settings."""
    scheduler: DPOSchedulerConfig = field(default_factory=DPOSchedulerConfig)
    """Learning-rate schedule."""

    def __post_init__(self):
        super().__post_init__()
        _check(not self.compile, "policy.compile", "not supported by rmkit dpo yet; set policy.compile=false")


@dataclass
class DPOCheckpointingConfig(CheckpointingConfig):
    """`checkpointing.*` with DPO's defaults."""

    checkpoint_dir: str = "results/dpo"
    """The run's output directory (the policy goes to `final/`, the reference log-probs to
    `reference_logprobs/`)."""
    save_period: int = 50
    """Save every this many steps (and at the last step)."""


@dataclass
class DPOTree:
    """The whole `rmkit dpo` config."""

    dpo: DPOLoopConfig = field(default_factory=DPOLoopConfig)
    policy: DPOPolicyConfig = field(default_factory=DPOPolicyConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpointing: DPOCheckpointingConfig = field(default_factory=DPOCheckpointingConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
