"""The config trees of the policy recipes (`rmkit sft`, `rmkit dpo`, `rmkit grpo`), torch-free so the command line
checks a config before torch loads. Each tree's loop section extends `rmkit.config.LoopConfig`; its other
sections are the shared ones of `rmkit.config`, with the recipe's defaults as default values (a YAML file or an
override is laid over them); loss keys are the losses' own configs (`rmkit.losses.configs`). Key names follow
NeMo RL (`examples/configs/{sft,dpo,grpo_math_1B}.yaml`); unknown keys are errors naming the dotted key, and
`policy.reward_model_cfg` is one (a policy has no reward head). The reward model's tree is `rmkit.config.Config`.

    cfg = load_config("configs/dpo.yaml", ["dpo.max_num_steps=10"], tree_type=DPOTree)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from rmkit.config import (
    CheckpointingConfig,
    DataConfig,
    LoggerConfig,
    LoopConfig,
    OptimizerConfig,
    PolicyConfig,
    Precision,
    SamplingParams,
    SchedulerConfig,
    _check,
)
from rmkit.data.demonstrations import DEMONSTRATION_FORMATS
from rmkit.losses.configs import ClippedPGLossConfig, DPOLossConfig

# ---------------------------------------------------------------- rmkit sft


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
    `messages`, `prompt_response`, `text` (TRL's plain text, every token trained on), or a preference format
    (its chosen side); `default` is the chosen side of the preference set that ships with rmkit."""

    messages_key: str = "messages"
    """Field holding a whole conversation (`messages` layout)."""
    response_key: str = "response"
    """Field holding the response (`prompt_response` layout; `completion` reads TRL's prompt-completion)."""

    def __post_init__(self):
        super().__post_init__()
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


# ---------------------------------------------------------------- rmkit dpo


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


# ---------------------------------------------------------------- rmkit grpo


@dataclass
class AdvEstimatorConfig:
    """`grpo.adv_estimator.*` (NeMo RL's): which advantage estimator turns rewards into advantages."""

    name: Literal["grpo", "reinforce_plus_plus"] = "grpo"
    """`grpo`: per prompt group, `(r - baseline) / std` (RLOO: `use_leave_one_out_baseline: true`,
    `normalize_rewards: false`); `reinforce_plus_plus`: `r - group mean`, whitened over the batch's tokens."""
    minus_baseline: bool = True
    """Reinforce++: subtract the prompt group's mean reward before whitening."""


@dataclass
class GRPOLoopConfig(LoopConfig):
    """The loop (`grpo.*`). `max_num_steps` counts steps of one rollout batch each (`rollout /
    policy.train_global_batch_size` optimizer steps)."""

    section: ClassVar[str] = "grpo"

    num_prompts_per_step: int = 8
    """Prompts per step (over all data-parallel ranks); each is sampled `num_generations_per_prompt` times."""
    num_generations_per_prompt: int = 4
    """G: completions per prompt; the group whose rewards give each completion's baseline."""
    normalize_rewards: bool = True
    """GRPO: divide each advantage by its group's reward std (rows whose std is 0 are left as they are)."""
    use_leave_one_out_baseline: bool = True
    """GRPO: the baseline (and std) of a completion is over the *other* completions of its prompt."""
    adv_estimator: AdvEstimatorConfig = field(default_factory=AdvEstimatorConfig)
    """The advantage estimator."""
    advantage_clip_low: float | None = None
    """Clamp advantages below (after normalization); null: unclipped."""
    advantage_clip_high: float | None = None
    """Clamp advantages above; null: unclipped."""
    max_val_samples: int = 32
    """Held-out prompts per validation (one completion each)."""
    val_batch_size: int = 32
    """Held-out prompts generated for together."""

    def __post_init__(self):
        super().__post_init__()
        for key in ("num_prompts_per_step", "num_generations_per_prompt", "max_val_samples", "val_batch_size"):
            _check(getattr(self, key) >= 1, f"grpo.{key}", "must be >= 1")
        low, high = self.advantage_clip_low, self.advantage_clip_high
        _check(low is None or high is None or low <= high, "grpo.advantage_clip_low", "must be <= advantage_clip_high")


@dataclass
class GRPOPolicyConfig(PolicyConfig):
    """`policy.*`: the shared policy section (a causal LM here) plus generation. `train_global_batch_size`
    counts completions per optimizer step; a rollout of `num_prompts_per_step * num_generations_per_prompt`
    completions gives that divided by it optimizer steps."""

    generation: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=64))
    """Rollout sampling."""
    generation_batch_size: int = 32
    """Completions generated together (one `generate` call)."""

    def __post_init__(self):
        super().__post_init__()
        _check(self.generation_batch_size >= 1, "policy.generation_batch_size", "must be >= 1")


@dataclass
class RewardModelEnvConfig:
    """`env.reward_model.*`: exactly one of `model_name` (scored in process) or `url` (`rmkit serve`)."""

    model_name: str | None = None
    """An rmkit reward-model directory (`rmkit train`'s `final/`) or any HF sequence classifier."""
    url: str | None = None
    """A running `rmkit serve`, e.g. http://127.0.0.1:8000."""
    api_key: str | None = None
    """The server's API key, if it has one."""
    batch_size: int = 32
    """Conversations per scoring batch (in process) or per request (server)."""
    precision: Precision = "float32"
    """In process: the dtype the reward model runs in."""
    normalize: bool = False
    """In process: rewards as (r - mean) / std with the model's validation statistics (`reward_stats.json`)."""
    retry_deadline: float = 120.0
    """Server: seconds a request that meets a connection error, a timeout or a 5xx is retried (backoff from 0.25 s,
    doubling up to 10 s) before the run stops, naming the URL and the last checkpoint; a server restart within
    it costs the run nothing."""
    max_retries: int | None = None
    """Server: at most this many extra attempts per request (null: as many as `retry_deadline` allows)."""
    timeout: float = 60.0
    """Server: seconds per request."""

    def __post_init__(self):
        _check(self.model_name is None or self.url is None, "env.reward_model.model_name",
               "set exactly one of model_name (in process) or url (a running rmkit serve), not both")
        _check(self.batch_size >= 1, "env.reward_model.batch_size", "must be >= 1")
        _check(self.max_retries is None or self.max_retries >= 0, "env.reward_model.max_retries", "must be >= 0")
        _check(self.retry_deadline >= 0, "env.reward_model.retry_deadline", "must be >= 0 (seconds)")
        _check(self.url is None or not self.normalize, "env.reward_model.normalize",
               "is for in-process scoring; start the server with --normalize instead")


@dataclass
class EnvConfig:
    """`env.*`."""

    reward_model: RewardModelEnvConfig = field(default_factory=RewardModelEnvConfig)
    """The reward model the policy is optimized against."""


@dataclass
class GRPOConfig:
    """The whole `rmkit grpo` config."""

    grpo: GRPOLoopConfig = field(default_factory=lambda: GRPOLoopConfig(max_num_steps=100, val_period=10, log_period=1))
    loss_fn: ClippedPGLossConfig = field(default_factory=ClippedPGLossConfig)
    policy: GRPOPolicyConfig = field(default_factory=lambda: GRPOPolicyConfig(
        model_name="smollm2", train_global_batch_size=32, train_micro_batch_size=8, max_total_sequence_length=512))
    env: EnvConfig = field(default_factory=EnvConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpointing: CheckpointingConfig = field(default_factory=lambda: CheckpointingConfig(
        checkpoint_dir="results/grpo", metric_name="validation/reward_mean", higher_is_better=True, save_period=10))
    logger: LoggerConfig = field(default_factory=LoggerConfig)

    def __post_init__(self):
        _check(not self.policy.compile, "policy.compile", "not supported by rmkit grpo yet; set policy.compile=false")
        _check(self.policy.generation.temperature > 0, "policy.generation.temperature",
               "must be > 0 (GRPO samples its rollouts)")
        rollout = self.grpo.num_prompts_per_step * self.grpo.num_generations_per_prompt
        g = self.policy.train_global_batch_size
        _check(rollout % g == 0, "policy.train_global_batch_size",
               f"({g}) must divide the rollout batch num_prompts_per_step * num_generations_per_prompt ({rollout})")
        gen = self.policy.generation
        _check(gen.max_new_tokens < self.policy.max_total_sequence_length, "policy.generation.max_new_tokens",
               f"({gen.max_new_tokens}) must be below policy.max_total_sequence_length "
               f"({self.policy.max_total_sequence_length}), which holds prompt + completion")
