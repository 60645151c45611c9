"""The GRPO recipe's config tree (`rmkit grpo`): key names follow NeMo RL's `grpo_math_1B.yaml` /
`grpo_rm_1B.yaml` where they apply.

    grpo.*                  the loop: prompts and generations per step, advantages, validation, seed
    loss_fn.*               every `ClippedPGLossFn` key, with NeMo RL's defaults
    policy.*                the shared `PolicyConfig` plus `policy.generation.*` (sampling) and
                            `policy.generation_batch_size`
    env.reward_model.*      the reward model: an rmkit model directory in process, or a running `rmkit serve`
    data.*, checkpointing.*, logger.*   the shared sections

Unknown keys are errors naming the dotted key (`rmkit.config.load_config(..., tree_type=GRPOConfig)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from rmkit.config import (
    CheckpointingConfig,
    DataConfig,
    LoggerConfig,
    LoopConfig,
    PolicyConfig,
    Precision,
    SamplingParams,
    _check,
)
from rmkit.losses.configs import ClippedPGLossConfig


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
    max_retries: int = 3
    """Server: extra attempts after a connection error or a 5xx, with exponential backoff."""
    timeout: float = 60.0
    """Server: seconds per request."""

    def __post_init__(self):
        _check(self.model_name is None or self.url is None, "env.reward_model.model_name",
               "set exactly one of model_name (in process) or url (a running rmkit serve), not both")
        _check(self.batch_size >= 1, "env.reward_model.batch_size", "must be >= 1")
        _check(self.max_retries >= 0, "env.reward_model.max_retries", "must be >= 0")
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
