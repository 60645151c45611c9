"""The config trees of the policy recipes (`rmkit sft`, `rmkit dpo`, `rmkit grpo`, `rmkit ppo`), torch-free so the command line
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
    TokenizerConfig,
    _check,
)
from rmkit.data.demonstrations import DEMONSTRATION_FORMATS
from rmkit.data.steps import STEP_FORMATS
from rmkit.losses.configs import ClippedPGLossConfig, DPOLossConfig, MseValueLossConfig

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
class RewardScalingConfig:
    """`<loop>.reward_scaling.*` (NeMo RL's): rewards clamped to `[source_min, source_max]`, then mapped linearly
    onto `[target_min, target_max]`, before any advantage is computed."""

    enabled: bool = False
    """Scale the rewards."""
    source_min: float = 0.0
    """The reward range expected from the reward model: lower end (rewards below are clamped)."""
    source_max: float = 1.0
    """Upper end (rewards above are clamped)."""
    target_min: float = 0.0
    """Where source_min lands."""
    target_max: float = 1.0
    """Where source_max lands."""


@dataclass
class RewardShapingConfig:
    """`<loop>.reward_shaping.*` (NeMo RL's, after DAPO; TRL's EOS trick): a penalty on completions by how they
    ended. With `stop_properly_penalty_coef`, a truncated completion's reward is multiplied by it (and the
    overlong keys are not used); otherwise a completion longer than `max_response_length -
    overlong_buffer_length` tokens loses `overlong_buffer_penalty` per `overlong_buffer_length` tokens beyond
    it. Then `missing_eos_penalty` is taken off every truncated completion's reward."""

    enabled: bool = False
    """Shape the rewards."""
    overlong_buffer_length: int | None = None
    """Tokens over which the overlong penalty grows to `overlong_buffer_penalty`."""
    overlong_buffer_penalty: float | None = None
    """The penalty at `max_response_length` tokens."""
    max_response_length: int | None = None
    """Completion length at which the full penalty applies."""
    stop_properly_penalty_coef: float | None = None
    """In [0, 1]: a truncated completion (no EOS within max_new_tokens) keeps this share of its reward. A
    share of a negative reward is a raise: with rewards below 0 use `missing_eos_penalty`."""
    missing_eos_penalty: float | None = None
    """TRL's `missing_eos_penalty` (its "EOS trick"): subtracted from the reward of a truncated completion (no
    EOS within max_new_tokens), whatever the reward's sign."""


@dataclass
class RLLoopConfig(LoopConfig):
    """The loop keys both RL recipes have (`grpo.*`, `ppo.*`): rollouts, validation, what is done to the rewards,
    and the guards against reward hacking. `max_num_steps` counts steps of one rollout batch each."""

    num_prompts_per_step: int = 8
    """Prompts per step (over all data-parallel ranks); each is sampled `num_generations_per_prompt` times."""
    num_generations_per_prompt: int = 4
    """Completions per prompt (GRPO: the group whose rewards give each completion's baseline)."""
    max_val_samples: int = 32
    """Held-out prompts per validation (one completion each)."""
    val_batch_size: int = 32
    """Held-out prompts generated for together."""
    reward_scaling: RewardScalingConfig = field(default_factory=RewardScalingConfig)
    """Map the rewards from one range onto another."""
    reward_shaping: RewardShapingConfig = field(default_factory=RewardShapingConfig)
    """Penalize truncated or overlong completions."""
    kl_target: float | None = None
    """Adaptive KL control (InstructGPT-style PPO, OpenRLHF's `kl_target`): after each step the KL coefficient
    `loss_fn.reference_policy_kl_penalty` is multiplied by `1 + clip(KL / kl_target - 1, -0.2, 0.2) * n /
    kl_horizon` (n: the step's completions), so the KL to the reference is held near this; null: a fixed
    coefficient."""
    kl_horizon: int = 10000
    """Completions over which the adaptive KL coefficient moves by the clipped error."""
    length_collapse_ratio: float = 0.5
    """Warn when the held-out mean completion length falls below this share of its step-0 value (reward
    hacking by saying little); 0: never."""
    kl_runaway_factor: float = 3.0
    """Warn when the step's KL to the reference exceeds this many times `kl_target` (or, without a target, when
    it exceeds 1.0 nats per token); 0: never."""
    prev_logprobs_from_generation: bool = False
    """Take the log-probs of the policy before the update (`prev_logprobs`) from the sampler instead of a
    forward pass of their own (TRL's and OpenRLHF's way; NeMo RL always runs the pass). Saves one forward over
    the rollout when the update needs them first (several optimizer steps per rollout, or the KL in the
    reward). Equal up to rounding in float32; in bf16, or with a sampler other than this policy's forward, the
    first update's ratio is off 1 by the sampler's error, which `train/token_mult_prob_error` then no longer
    shows (it reads 1)."""

    def __post_init__(self):
        super().__post_init__()
        for key in ("num_prompts_per_step", "num_generations_per_prompt", "max_val_samples", "val_batch_size",
                    "kl_horizon"):
            _check(getattr(self, key) >= 1, f"{self.section}.{key}", "must be >= 1")
        _check(self.kl_target is None or self.kl_target > 0, f"{self.section}.kl_target", "must be > 0 or null")
        _check(0 <= self.length_collapse_ratio < 1, f"{self.section}.length_collapse_ratio", "must be in [0, 1)")
        _check(self.kl_runaway_factor >= 0, f"{self.section}.kl_runaway_factor", "must be >= 0")
        scaling, shaping = self.reward_scaling, self.reward_shaping
        _check(scaling.source_max > scaling.source_min, f"{self.section}.reward_scaling.source_max",
               "must be above source_min")
        coef = shaping.stop_properly_penalty_coef
        key = f"{self.section}.reward_shaping"
        _check(coef is None or 0 <= coef <= 1, f"{key}.stop_properly_penalty_coef", "must be in [0, 1]")
        overlong = (shaping.overlong_buffer_length, shaping.overlong_buffer_penalty, shaping.max_response_length)
        _check(not shaping.enabled or coef is not None or None not in overlong
               or shaping.missing_eos_penalty is not None, f"{key}.enabled",
               "needs stop_properly_penalty_coef, missing_eos_penalty, or all of overlong_buffer_length, "
               "overlong_buffer_penalty and max_response_length")
        _check(overlong.count(None) in (0, 3), f"{key}.max_response_length",
               "overlong_buffer_length, overlong_buffer_penalty and max_response_length go together: set all three "
               "or none")
        _check(shaping.overlong_buffer_length is None or shaping.overlong_buffer_length >= 1,
               f"{key}.overlong_buffer_length", "must be >= 1")
        _check(shaping.overlong_buffer_penalty is None or shaping.overlong_buffer_penalty >= 0,
               f"{key}.overlong_buffer_penalty", "must be >= 0")
        _check(shaping.missing_eos_penalty is None or shaping.missing_eos_penalty >= 0,
               f"{key}.missing_eos_penalty", "must be >= 0")


@dataclass
class GRPOLoopConfig(RLLoopConfig):
    """The loop (`grpo.*`). A step is one rollout, `rollout / policy.train_global_batch_size` optimizer steps."""

    section: ClassVar[str] = "grpo"

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

    def __post_init__(self):
        super().__post_init__()
        low, high = self.advantage_clip_low, self.advantage_clip_high
        _check(low is None or high is None or low <= high, "grpo.advantage_clip_low", "must be <= advantage_clip_high")


@dataclass
class RLPolicyConfig(PolicyConfig):
    """`policy.*` of the RL recipes: the shared policy section (a causal LM here) plus generation. `train_global_batch_size`
    counts completions per optimizer step; a rollout of `num_prompts_per_step * num_generations_per_prompt`
    completions gives that divided by it optimizer steps."""

    generation: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=64))
    """Rollout sampling."""
    generation_batch_size: int = 32
    """Completions generated together (one `generate` call)."""

    def __post_init__(self):
        super().__post_init__()
        _check(self.generation_batch_size >= 1, "policy.generation_batch_size", "must be >= 1")


def rl_policy() -> RLPolicyConfig:
    """The RL recipes' `policy.*`: SmolLM2-135M-Instruct, 32 completions per optimizer step in micro-batches of 8,
    512 tokens, and the small constant learning rate RL fine-tuning wants (AdamW lr 1e-6, no decay of it; the
    reward model's 5e-5 cosine schedule moves a policy 50x as fast)."""
    return RLPolicyConfig(model_name="smollm2", train_global_batch_size=32, train_micro_batch_size=8,
                          max_total_sequence_length=512, optimizer=OptimizerConfig(lr=1e-6),
                          scheduler=SchedulerConfig(name="constant"))


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
    policy: RLPolicyConfig = field(default_factory=rl_policy)
    env: EnvConfig = field(default_factory=EnvConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpointing: CheckpointingConfig = field(default_factory=lambda: CheckpointingConfig(
        checkpoint_dir="results/grpo", metric_name="validation/reward_mean", higher_is_better=True, save_period=10))
    logger: LoggerConfig = field(default_factory=LoggerConfig)

    def __post_init__(self):
        check_rollout_layout(self.grpo, self.policy, "grpo")


def check_rollout_layout(loop: RLLoopConfig, policy: RLPolicyConfig, recipe: str) -> None:
    """What both RL trees need of the policy: sampling, a rollout that splits into whole optimizer steps, room
    for the completion."""
    _check(not policy.compile, "policy.compile", f"not supported by rmkit {recipe} yet; set policy.compile=false")
    _check(policy.generation.temperature > 0, "policy.generation.temperature",
           f"must be > 0 ({recipe} samples its rollouts)")
    rollout = loop.num_prompts_per_step * loop.num_generations_per_prompt
    g = policy.train_global_batch_size
    _check(rollout % g == 0, "policy.train_global_batch_size",
           f"({g}) must divide the rollout batch num_prompts_per_step * num_generations_per_prompt ({rollout})")
    gen = policy.generation
    _check(gen.max_new_tokens < policy.max_total_sequence_length, "policy.generation.max_new_tokens",
           f"({gen.max_new_tokens}) must be below policy.max_total_sequence_length "
           f"({policy.max_total_sequence_length}), which holds prompt + completion")


# ---------------------------------------------------------------- rmkit ppo


@dataclass
class GAEConfig:
    """`ppo.adv_estimator.*` (NeMo RL's `gae` estimator, `rmkit.losses.value.gae_advantages`): per-token
    advantages and the critic's returns from the reward at the last token, the KL in the reward (with
    `loss_fn.use_kl_in_reward`) and the critic's values."""

    name: Literal["gae"] = "gae"
    """The estimator; PPO's is GAE (for critic-free estimators use `rmkit grpo`)."""
    gae_lambda: float = 0.95
    """lambda: 0 is one-step TD (low variance, biased by the critic), 1 the Monte Carlo return."""
    gae_gamma: float = 1.0
    """Discount per token."""
    normalize_advantages: bool = True
    """Whiten the advantages over the rollout's tokens (all ranks'), not the returns."""
    gae_lambda_value: float | None = None
    """VAPO: lambda for the critic's returns alone (1.0: Monte Carlo returns); null: gae_lambda."""
    gae_lambda_policy: float | None = None
    """VAPO: lambda for the policy's advantages alone; null: gae_lambda (or length-adaptive)."""
    length_adaptive_alpha: float = 0.0
    """VAPO: the policy's lambda per completion `1 - 1 / (alpha * length)`; 0: off."""

    def __post_init__(self):
        for key in ("gae_lambda", "gae_gamma", "gae_lambda_value", "gae_lambda_policy"):
            value = getattr(self, key)
            _check(value is None or 0 <= value <= 1, f"ppo.adv_estimator.{key}", "must be in [0, 1]")
        _check(self.length_adaptive_alpha >= 0, "ppo.adv_estimator.length_adaptive_alpha", "must be >= 0")


@dataclass
class PPOLoopConfig(RLLoopConfig):
    """The loop (`ppo.*`, NeMo RL's `examples/configs/ppo_math_1B.yaml`). A step is one rollout, then
    `ppo_epochs` passes over it, each `rollout / policy.train_global_batch_size` optimizer steps of the critic
    and the policy."""

    section: ClassVar[str] = "ppo"

    ppo_epochs: int = 4
    """Passes over each rollout (the ratio to the rollout's policy is clipped from the second on)."""
    policy_training_start_step: int = 0
    """Steps in which only the critic trains (critic warmup); the policy's learning rate is 0 until then."""
    adv_estimator: GAEConfig = field(default_factory=GAEConfig)
    """Generalized advantage estimation."""
    shuffle_minibatches: bool = False
    """Each epoch takes the rollout's rows in a new order, drawn from (seed, step, epoch), before cutting it into
    global batches (TRL, OpenRLHF); false: the same batches in the rollout's order every epoch (NeMo RL). Under
    torchrun each rank shuffles its own share."""
    score_after_end: bool = False
    """Where a finished completion's reward goes. false: at its last token (EOS), as NeMo RL, OpenRLHF and verl
    put it. true: TRL's PPOTrainer: one position later, at the state after the last token, which the critic
    values and learns too (its head at the last token); GAE runs through that state, the policy does not train
    there. A completion that ran out of `max_new_tokens`, or ended on the last one, keeps it at its last token."""
    seq_logprob_error_threshold: float | None = None
    """Leave out of the update a completion whose mean `exp(|generation - training log-prob|)` exceeds this
    (the sampler and the trainer disagree); null: only logged."""

    def __post_init__(self):
        super().__post_init__()
        _check(self.ppo_epochs >= 1, "ppo.ppo_epochs", "must be >= 1")
        _check(self.policy_training_start_step >= 0, "ppo.policy_training_start_step", "must be >= 0")
        threshold = self.seq_logprob_error_threshold
        _check(threshold is None or threshold >= 1, "ppo.seq_logprob_error_threshold", "must be >= 1 or null")
        _check(threshold is None or not self.prev_logprobs_from_generation, "ppo.seq_logprob_error_threshold",
               "compares the sampler's log-probs with the trainer's, which ppo.prev_logprobs_from_generation makes "
               "the same numbers; set one of them to null / false")


@dataclass
class ValueConfig:
    """`value.*`: the critic, a causal LM with a scalar head giving a value at every token. It trains beside the
    policy, on the same rollout rows in the same optimizer steps, with its own optimizer settings; sequence
    length, threads and sharding follow `policy.*`."""

    model_name: str | None = None
    """null: the reward model (`env.reward_model.model_name`) when it is a causal-LM classifier with the
    policy's tokenizer (NeMo Aligner, OpenRLHF), else the policy's weights with a fresh scalar head (NeMo RL).
    A directory or hub id: that model (a classifier keeps its head; a causal LM gets a fresh one)."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """The critic's tokenizer; it must be the policy's (the critic reads the policy's token ids)."""
    train_global_batch_size: int | None = None
    """Completions per critic optimizer step; null: policy.train_global_batch_size (the only value allowed)."""
    train_micro_batch_size: int | None = None
    """Completions per critic forward/backward and per value pass; null: policy.train_micro_batch_size."""
    precision: Precision | None = None
    """null: policy.precision."""
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=2e-6, weight_decay=0.1))
    """AdamW settings of the critic."""
    scheduler: SchedulerConfig = field(default_factory=lambda: SchedulerConfig(name="constant", warmup_steps=0))
    """The critic's learning-rate schedule."""
    max_grad_norm: float | None = 1.0
    """Clip the critic's gradient norm to this; null: no clipping."""
    gradient_checkpointing: bool = False
    """Recompute the critic's activations in backward."""
    calibrate_offset: bool = True
    """On the run's first rollout, shift the critic's values by one constant so that their mean over the response
    tokens equals the mean Monte Carlo return there (kept in the critic's `config.rmkit_value_offset`, logged as
    `critic/value_offset`). A reward model read inside a response is not read where it was trained: the
    SmolLM2 HH reward model reads +1.5 above its score there, which the clipped value loss undoes by at most
    `value_loss_fn.cliprange` a step and which until then gives every completion's last tokens a large negative
    advantage. false: the critic's head as it loads."""

    def __post_init__(self):
        _check(self.max_grad_norm is None or self.max_grad_norm > 0, "value.max_grad_norm", "must be > 0 or null")
        for key in ("train_global_batch_size", "train_micro_batch_size"):
            value = getattr(self, key)
            _check(value is None or value >= 1, f"value.{key}", "must be >= 1 or null")

    def as_policy(self, policy: PolicyConfig, model_name: str) -> PolicyConfig:
        """The critic as the shared machinery takes a model's settings (`PolicyConfig`): its own where it has
        them, the policy's otherwise (length, threads, sharding)."""
        return PolicyConfig(
            model_name=model_name, tokenizer=self.tokenizer, train_global_batch_size=policy.train_global_batch_size,
            train_micro_batch_size=self.train_micro_batch_size or policy.train_micro_batch_size,
            max_total_sequence_length=policy.max_total_sequence_length, precision=self.precision or policy.precision,
            optimizer=self.optimizer, scheduler=self.scheduler, max_grad_norm=self.max_grad_norm,
            gradient_checkpointing=self.gradient_checkpointing, num_threads=policy.num_threads,
            dtensor_cfg=policy.dtensor_cfg)


@dataclass
class PPOConfig:
    """The whole `rmkit ppo` config: SmolLM2-135M-Instruct policy, the critic chosen by `value.model_name`, 8
    prompts x 4 completions per step, 4 PPO epochs, GAE (lambda 0.95, gamma 1, whitened), value clipping 0.2."""

    ppo: PPOLoopConfig = field(default_factory=lambda: PPOLoopConfig(max_num_steps=100, val_period=10, log_period=1))
    loss_fn: ClippedPGLossConfig = field(default_factory=ClippedPGLossConfig)
    value_loss_fn: MseValueLossConfig = field(default_factory=lambda: MseValueLossConfig(cliprange=0.2))
    value: ValueConfig = field(default_factory=ValueConfig)
    policy: RLPolicyConfig = field(default_factory=rl_policy)
    env: EnvConfig = field(default_factory=EnvConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpointing: CheckpointingConfig = field(default_factory=lambda: CheckpointingConfig(
        checkpoint_dir="results/ppo", metric_name="validation/reward_mean", higher_is_better=True, save_period=10))
    logger: LoggerConfig = field(default_factory=LoggerConfig)

    def __post_init__(self):
        check_rollout_layout(self.ppo, self.policy, "ppo")
        g = self.value.train_global_batch_size
        _check(g is None or g == self.policy.train_global_batch_size, "value.train_global_batch_size",
               f"({g}) must equal policy.train_global_batch_size ({self.policy.train_global_batch_size}): the "
               "critic and the policy take their optimizer steps together; set it to null")
        m = self.value.train_micro_batch_size
        _check(m is None or self.policy.train_global_batch_size % m == 0, "value.train_micro_batch_size",
               f"({m}) must divide policy.train_global_batch_size ({self.policy.train_global_batch_size})")


# ---------------------------------------------------------------- rmkit train (a process reward model)


@dataclass
class PRMLoopConfig(LoopConfig):
    """The process reward model's loop (`prm.*`); the step keys follow TRL's `PRMConfig`."""

    section: ClassVar[str] = "prm"

    step_separator: str = "\n"
    """Text put after every step (TRL's default); each step's label is read at the separator's last token. A step
    whose text holds it is a data error."""
    train_on_last_step_only: bool = False
    """Put loss on the last step of each solution only (TRL's key); the other steps stay in the text."""
    ambiguous: Literal["drop", "correct"] = "drop"
    """PRM800K's neutral steps (rating 0): `drop` keeps them in the text with no label; `correct` labels them
    correct (`rmkit.data.steps`)."""
    aggregation: Literal["min", "prod", "last"] = "min"
    """How the exported model's step probabilities make one reward for a solution (written to the scoring
    contract): the lowest, their product, or the last step's."""
    share_prefixes: bool | Literal["auto"] = "auto"
    """A decoder computes the beginning that solutions of a micro-batch share once (`rmkit.models.prefix_tree`):
    the same values and gradients within float rounding, fewer tokens through the model. It pays when batches hold
    solutions of one problem: the shipped length-grouped batches hold many (PRM800K's branch after every step;
    1.57x faster, the same optimizer steps), `data.batching: prefix_grouped` more (but a changed data order).
    `auto`: a decoder's micro-batches are cut in token order and each goes through its prefix tree where that is
    estimated cheaper than its padded rows (`rmkit.models.prefix_tree.tree_pays`: solutions that share only a short
    beginning would make one wide tree whose attention costs more), an encoder's as without; `true`: every
    micro-batch through its tree (an encoder, a row per step, shares nothing this way and is refused); `false`:
    none."""
    val_batches: int | None = None
    """Validate on at most this many batches of `val_global_batch_size` solutions per set; None: all."""
    val_global_batch_size: int = 32
    """Solutions per validation batch."""
    val_micro_batch_size: int = 8
    """Solutions per validation forward pass."""

    def __post_init__(self):
        super().__post_init__()
        _check(self.step_separator != "", "prm.step_separator", "must be a non-empty string")
        _check(self.ambiguous in ("drop", "correct"), "prm.ambiguous", "must be one of drop, correct")
        _check(self.aggregation in ("min", "prod", "last"), "prm.aggregation", "must be one of min, prod, last")
        _check(self.val_batches is None or self.val_batches >= 1, "prm.val_batches", "must be >= 1 or null")
        _check(self.val_global_batch_size >= 1, "prm.val_global_batch_size", "must be >= 1")
        _check(self.val_micro_batch_size >= 1, "prm.val_micro_batch_size", "must be >= 1")


@dataclass
class PRMDataConfig(DataConfig):
    """`data.*`: the shared data options; `format` is a step-labelled layout (`rmkit.data.steps`): auto (sniffed),
    `stepwise` (TRL's), `prm800k`, `processbench` or `prmbench`."""

    train_data_path: str = "../shared/data/prm/prm800k/phase1_train.parquet"
    """Training file: step-labelled solutions."""
    val_data_paths: dict[str, str] = field(
        default_factory=lambda: {"prm800k": "../shared/data/prm/prm800k/phase1_test.parquet"})
    """Validation sets by name (metrics `validation-<name>/...`)."""

    batching: Literal["length_grouped", "random", "prefix_grouped"] = "length_grouped"
    """`length_grouped`: solutions of similar length share a batch (little padding); `random`: plain shuffle;
    `prefix_grouped`: solutions that begin alike (one problem, its shared steps) share a batch, for
    `prm.share_prefixes` (`rmkit.data.sampler.PrefixGroupedBatchSampler`; the batches are less mixed than random
    ones)."""

    def __post_init__(self):
        super().__post_init__()
        _check(self.format in STEP_FORMATS, "data.format", f"must be one of {', '.join(STEP_FORMATS)}")


@dataclass
class PRMTree:
    """The whole process-reward-model config (`rmkit train` with a `prm` section). `policy.*`: SmolLM2-135M-Instruct
    (a decoder) with a scalar head read at every step's separator, 32 solutions per step in micro-batches of 4,
    AdamW at lr 1e-5 (TRL's PRMConfig)."""

    prm: PRMLoopConfig = field(default_factory=PRMLoopConfig)
    policy: PolicyConfig = field(default_factory=lambda: PolicyConfig(
        model_name="smollm2", train_global_batch_size=32, train_micro_batch_size=4, max_total_sequence_length=512,
        optimizer=OptimizerConfig(lr=1e-5)))
    data: PRMDataConfig = field(default_factory=PRMDataConfig)
    checkpointing: CheckpointingConfig = field(default_factory=lambda: CheckpointingConfig(
        checkpoint_dir="results/prm", metric_name="val:validation-prm800k_loss"))
    logger: LoggerConfig = field(default_factory=LoggerConfig)
