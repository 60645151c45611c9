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

from dataclasses import dataclass, field, fields
from typing import Literal

from rmkit.config import CheckpointingConfig, DataConfig, LoggerConfig, PolicyConfig, Precision, _check
from rmkit.errors import ConfigError
from rmkit.losses.policy_gradient import DEFAULTS as LOSS_DEFAULTS
from rmkit.losses.policy_gradient import ClippedPGLossFn


@dataclass
class AdvEstimatorConfig:
    """`grpo.adv_estimator.*` (NeMo RL's): which advantage estimator turns rewards into advantages."""

    name: Literal["grpo", "reinforce_plus_plus"] = "grpo"
    """`grpo`: per prompt group, `(r - baseline) / std` (RLOO: `use_leave_one_out_baseline: true`,
    `normalize_rewards: false`); `reinforce_plus_plus`: `r - group mean`, whitened over the batch's tokens."""
    minus_baseline: bool = True
    """Reinforce++: subtract the prompt group's mean reward before whitening."""


@dataclass
class GRPOLoopConfig:
    """The loop (`grpo.*`)."""

    num_prompts_per_step: int = 8
    """Prompts per step (over all data-parallel ranks); each is sampled `num_generations_per_prompt` times."""
    num_generations_per_prompt: int = 4
    """G: completions per prompt; the group whose rewards give each completion's baseline."""
    max_num_steps: int = 100
    """Steps (one rollout batch each, `rollout / policy.train_global_batch_size` optimizer steps)."""
    max_num_epochs: int = 1
    """Passes over the prompts; the run stops at whichever of this and `max_num_steps` comes first."""
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
    val_period: int = 10
    """Validate every this many steps (0: only at start / end)."""
    val_at_start: bool = True
    """Validate before the first step (the step-0 reward the run is judged against)."""
    val_at_end: bool = True
    """Validate after the last step."""
    max_val_samples: int = 32
    """Held-out prompts per validation (one completion each)."""
    val_batch_size: int = 32
    """Held-out prompts generated for together."""
    seed: int = 42
    """Seeds torch, the prompt order and the sampling generator (saved in checkpoints)."""
    log_period: int = 1
    """Write training metrics every this many steps."""

    def __post_init__(self):
        for key in ("num_prompts_per_step", "num_generations_per_prompt", "max_num_steps", "max_num_epochs",
                    "max_val_samples", "val_batch_size", "log_period"):
            _check(getattr(self, key) >= 1, f"grpo.{key}", "must be >= 1")
        _check(self.val_period >= 0, "grpo.val_period", "must be >= 0")
        low, high = self.advantage_clip_low, self.advantage_clip_high
        _check(low is None or high is None or low <= high, "grpo.advantage_clip_low", "must be <= advantage_clip_high")


@dataclass
class LossFnConfig:
    """`loss_fn.*`: every key of `rmkit.losses.policy_gradient.ClippedPGLossFn`, NeMo RL's defaults."""

    reference_policy_kl_penalty: float = 0.01
    """beta: weight of the KL to the reference policy (the initial weights); 0: no reference pass."""
    ratio_clip_min: float = 0.2
    """PPO clip: the ratio is clipped below at 1 - ratio_clip_min."""
    ratio_clip_max: float = 0.2
    """PPO clip: above at 1 + ratio_clip_max (DAPO's clip-higher when larger)."""
    use_on_policy_kl_approximation: bool = False
    """Weight the KL by exp(curr - gen)."""
    use_importance_sampling_correction: bool = False
    """Weight the actor loss by exp(prev - gen)."""
    token_level_loss: bool = True
    """Mean over all tokens of the global batch (true) or each sequence's token mean (false)."""
    ratio_clip_c: float | None = None
    """Dual clip c > 1; null: off."""
    disable_ppo_ratio: bool = False
    """REINFORCE / RLOO: actor loss -A * logp, no ratio, no clipping."""
    reference_policy_kl_type: str = "k3"
    """KL estimator: k1, k2 or k3."""
    kl_input_clamp_value: float | None = 20.0
    """Clamp of ref - curr before the estimator; null: none."""
    kl_output_clamp_value: float | None = 10.0
    """Clamp of the weighted estimate; null: none."""
    sequence_level_importance_ratios: bool = False
    """GSPO: one ratio per sequence (needs token_level_loss: false)."""
    use_cispo: bool = False
    """CISPO: -A * sg(clip(r)) * logp."""
    truncated_importance_sampling_type: str | None = None
    """tis, icepop or seq-mask-tis (needs use_importance_sampling_correction); null: off."""
    truncated_importance_sampling_ratio: float | None = None
    """Upper bound of the truncated importance weights."""
    truncated_importance_sampling_ratio_min: float | None = None
    """Lower bound (icepop, seq-mask-tis)."""
    force_on_policy_ratio: bool = False
    """ratio = 1 (prev_logprobs unread)."""
    use_kl_in_reward: bool = False
    """The KL goes into the reward (Reinforce++): the loss uses beta = 0."""
    positive_example_nll_weight: float = 0.0
    """VAPO: + weight * NLL of completions with a positive reward."""

    def __post_init__(self):
        try:
            ClippedPGLossFn(self.as_dict())
        except ValueError as err:  # the loss names the offending key in its message
            message = str(err).removeprefix("ClippedPGLossConfig: ")
            named = [k for k in LOSS_DEFAULTS if k in message]
            key = min(named, key=message.index) if named else "reference_policy_kl_penalty"
            raise ConfigError(f"loss_fn.{key}", message) from None

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class GenerationConfig:
    """`policy.generation.*`: how rollouts are sampled (`rmkit.generation.SamplingParams`)."""

    max_new_tokens: int = 64
    """Tokens per completion at most; a completion that reaches it without EOS is truncated."""
    temperature: float = 1.0
    """Sampling temperature (> 0: GRPO needs samples); the training log-probs use the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling."""
    top_k: int | None = None
    """Top-k sampling; null: off."""
    stop_strings: list[str] | None = None
    """Also stop a completion at the first of these strings (kept in the completion)."""

    def __post_init__(self):
        _check(self.max_new_tokens >= 1, "policy.generation.max_new_tokens", "must be >= 1")
        _check(self.temperature > 0, "policy.generation.temperature", "must be > 0 (GRPO samples its rollouts)")
        _check(0 < self.top_p <= 1, "policy.generation.top_p", "must be in (0, 1]")
        _check(self.top_k is None or self.top_k >= 1, "policy.generation.top_k", "must be >= 1 or null")
        _check(not self.stop_strings or all(self.stop_strings), "policy.generation.stop_strings",
               "must be non-empty strings")


@dataclass
class GRPOPolicyConfig(PolicyConfig):
    """`policy.*`: the shared policy section (a causal LM here) plus generation. `train_global_batch_size`
    counts completions per optimizer step; a rollout of `num_prompts_per_step * num_generations_per_prompt`
    completions gives that divided by it optimizer steps."""

    model_name: str = "smollm2"
    """The policy: a causal LM directory (GGUF too), a hub id, or `smollm2` (the packaged SmolLM2-135M-Instruct)."""
    train_global_batch_size: int = 32
    """Completions per optimizer step."""
    train_micro_batch_size: int = 8
    """Completions per forward/backward (and per log-prob pass)."""
    max_total_sequence_length: int = 512
    """Prompt + completion tokens; longer prompts (with `generation.max_new_tokens`) are skipped."""
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    """Rollout sampling."""
    generation_batch_size: int = 32
    """Completions generated together (one `generate` call)."""

    def __post_init__(self):
        super().__post_init__()
        _check(self.generation_batch_size >= 1, "policy.generation_batch_size", "must be >= 1")
        _check(not self.compile, "policy.compile", "not supported by rmkit grpo yet; set policy.compile=false")


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
class GRPOCheckpointingConfig(CheckpointingConfig):
    """`checkpointing.*` with GRPO's defaults: checkpoints ranked by the held-out reward."""

    checkpoint_dir: str = "results/grpo"
    """The run's output directory (the policy goes to `final/`)."""
    metric_name: str = "validation/reward_mean"
    """The metric that ranks checkpoints."""
    higher_is_better: bool = True
    """A larger held-out reward is better."""
    save_period: int = 10
    """Save every this many steps (and at the last step)."""


@dataclass
class GRPOConfig:
    """The whole `rmkit grpo` config."""

    grpo: GRPOLoopConfig = field(default_factory=GRPOLoopConfig)
    loss_fn: LossFnConfig = field(default_factory=LossFnConfig)
    policy: GRPOPolicyConfig = field(default_factory=GRPOPolicyConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpointing: GRPOCheckpointingConfig = field(default_factory=GRPOCheckpointingConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)

    def __post_init__(self):
        rollout = self.grpo.num_prompts_per_step * self.grpo.num_generations_per_prompt
        g = self.policy.train_global_batch_size
        _check(rollout % g == 0, "policy.train_global_batch_size",
               f"({g}) must divide the rollout batch num_prompts_per_step * num_generations_per_prompt ({rollout})")
        gen = self.policy.generation
        _check(gen.max_new_tokens < self.policy.max_total_sequence_length, "policy.generation.max_new_tokens",
               f"({gen.max_new_tokens}) must be below policy.max_total_sequence_length "
               f"({self.policy.max_total_sequence_length}), which holds prompt + completion")
