"""The training config: a typed dataclass tree loaded from YAML plus dotted overrides.

Key names mirror NeMo RL's `examples/configs/rm.yaml` where they apply (`rm.*`, `policy.*`, `data.*`,
`checkpointing.*`, `logger.*`). Unknown keys and values of the wrong type raise `ConfigError` naming the
dotted key; every field has a default, so a YAML file only states what it changes.

    cfg = load_config("configs/rm.yaml", ["policy.optimizer.lr=1e-5", "rm.max_num_steps=100"])
    save_config(cfg, "results/rm/config.yaml")
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from rmkit.errors import ConfigError

Precision = Literal["float32", "bfloat16"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"]  # torch.compile's modes rmkit takes
CompileScope = Literal["blocks", "stack"]  # what `policy.compile` compiles as one region


@dataclass
class LoopConfig:
    """The loop keys every recipe has, in its own section (`rm.*`, `sft.*`, `dpo.*`, `grpo.*`); a recipe's
    loop section extends this one with its own keys and sets its defaults as default values."""

    section: ClassVar[str] = "loop"

    max_num_epochs: int = 1
    """Passes over the training data; the run stops at whichever of this and `max_num_steps` comes first."""
    max_num_steps: int | None = None
    """Optimizer steps (one global batch each); None: no limit beyond the epochs."""
    val_period: int = 50
    """Validate every this many steps (0: only at start/end)."""
    val_at_start: bool = True
    """Validate before the first step (the untrained baseline)."""
    val_at_end: bool = True
    """Validate after the last step; false skips it only when the run has validated already (a run with validation
    data and no validation yet validates at the end anyway)."""
    seed: int = 42
    """Seeds torch, Python and the batch sampler."""
    log_period: int = 10
    """Write training metrics every this many steps (the progress bar updates every step)."""

    def __post_init__(self):
        _check(self.max_num_epochs >= 1, f"{self.section}.max_num_epochs", "must be >= 1")
        _check(self.max_num_steps is None or self.max_num_steps >= 1, f"{self.section}.max_num_steps",
               "must be >= 1 or null")
        _check(self.val_period >= 0, f"{self.section}.val_period", "must be >= 0")
        _check(self.log_period >= 1, f"{self.section}.log_period", "must be >= 1")


@dataclass
class RMConfig(LoopConfig):
    """The reward-model loop (`rm.*`)."""

    section: ClassVar[str] = "rm"

    val_batches: int | None = None
    """Validate on at most this many batches of `val_global_batch_size` pairs per set; None: all."""
    val_global_batch_size: int = 32
    """Pairs per validation batch (validation batches are length-sorted and token-budgeted)."""

    def __post_init__(self):
        super().__post_init__()
        _check(self.val_batches is None or self.val_batches >= 1, "rm.val_batches", "must be >= 1 or null")
        _check(self.val_global_batch_size >= 1, "rm.val_global_batch_size", "must be >= 1")


@dataclass
class TokenizerConfig:
    """`policy.tokenizer.*`."""

    name: str | None = None
    """Tokenizer directory or hub id; None: the model's own."""
    chat_template: str | None = None
    """A Jinja chat template that replaces the tokenizer's (used for message-format data)."""


@dataclass
class RewardModelConfig:
    """`policy.reward_model_cfg.*`."""

    enabled: bool = True
    """Kept for NeMo RL compatibility; rmkit always trains a reward model."""
    reward_model_type: Literal["bradley_terry", "regression"] = "bradley_terry"
    """`bradley_terry`: pairwise preference loss, one reward. `regression`: MSE on `num_labels` attributes."""
    num_labels: int = 1
    """Reward outputs K (1 for Bradley-Terry)."""

    def __post_init__(self):
        _check(self.num_labels >= 1, "policy.reward_model_cfg.num_labels", "must be >= 1")
        _check(
            self.reward_model_type == "regression" or self.num_labels == 1,
            "policy.reward_model_cfg.num_labels",
            "must be 1 for bradley_terry (use reward_model_type: regression for K attributes)",
        )


@dataclass
class OptimizerConfig:
    """AdamW (`policy.optimizer.*`); weight decay skips biases and norm weights."""

    lr: float = 5e-5
    """Peak learning rate."""
    weight_decay: float = 0.01
    """Decoupled weight decay on matrices."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam moment coefficients."""
    eps: float = 1e-8
    """Adam denominator epsilon."""

    def __post_init__(self):
        _check(self.lr > 0, "policy.optimizer.lr", "must be > 0")
        _check(self.weight_decay >= 0, "policy.optimizer.weight_decay", "must be >= 0")
        _check(all(0 <= b < 1 for b in self.betas), "policy.optimizer.betas", "must be in [0, 1)")


@dataclass
class SchedulerConfig:
    """`policy.scheduler.*`: linear warmup, then cosine decay to `min_lr_ratio * lr`, or constant."""

    name: Literal["cosine", "constant"] = "cosine"
    """`cosine` decays over the run's total steps; `constant` holds the peak after warmup."""
    warmup_steps: int = 0
    """Linear warmup steps from 0 to the peak learning rate."""
    warmup_ratio: float = 0.0
    """Alternative to `warmup_steps`: a fraction of the total steps (the larger of the two wins)."""
    min_lr_ratio: float = 0.0
    """Cosine floor as a fraction of the peak."""
    warmup_start_factor: float | None = None
    """Multiplier of the peak at the first step, rising linearly to 1 at the end of warmup. null:
    1/(warmup+1), so the first step already learns; 0.0: Hugging Face's schedule (TRL's), whose first
    step has lr 0."""

    def __post_init__(self):
        _check(self.warmup_steps >= 0, "policy.scheduler.warmup_steps", "must be >= 0")
        _check(self.warmup_start_factor is None or 0 <= self.warmup_start_factor <= 1,
               "policy.scheduler.warmup_start_factor", "must be null or in [0, 1]")
        _check(0 <= self.warmup_ratio < 1, "policy.scheduler.warmup_ratio", "must be in [0, 1)")
        _check(0 <= self.min_lr_ratio <= 1, "policy.scheduler.min_lr_ratio", "must be in [0, 1]")


@dataclass
class LoraConfig:
    """`policy.lora.*`: LoRA adapters through peft; the score head is always fully trained and saved."""

    enabled: bool = False
    """Train adapters instead of the whole backbone (merged into the exported model)."""
    r: int = 8
    """Adapter rank."""
    alpha: int = 16
    """Adapter scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: list[str] | None = None
    """Module names to adapt; None: peft's default for the architecture (all linear layers if unknown)."""

    def __post_init__(self):
        _check(self.r >= 1, "policy.lora.r", "must be >= 1")


@dataclass
class DTensorConfig:
    """`policy.dtensor_cfg.*` (NeMo RL's key): FSDP2 sharding (`torch.distributed.fsdp.fully_shard`) of
    parameters, gradients and optimizer state over the torchrun processes, instead of DDP's full copy
    on each. A single process (no torchrun, or `torchrun --nproc-per-node 1`) trains unsharded and writes
    full checkpoints; sharded runs write sharded ones (`rmkit.trainer.checkpointing.sharded`), and either
    resumes under any number of processes."""

    enabled: bool = False
    """Shard each transformer block, the input embeddings and then the whole model with FSDP2."""
    reshard_after_forward: bool = True
    """Free each block's gathered parameters after its forward and gather them again in backward (less
    memory, one more all-gather per block); false keeps them until backward."""
    cpu_offload: bool = False
    """Keep the parameter shards, their gradients and the optimizer state in (pinned) CPU memory; the
    optimizer step then runs on the CPU."""
    param_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """The dtype parameters are gathered and computed in (FSDP2's `MixedPrecisionPolicy`); `auto` follows
    `policy.precision`. Gradients are always reduced in float32 and the shards stay float32."""

    def __post_init__(self):
        _check(self.param_dtype in ("auto", "float32", "bfloat16"), "policy.dtensor_cfg.param_dtype",
               "must be auto, float32 or bfloat16")


@dataclass
class PolicyConfig:
    """The model and its optimization (`policy.*`)."""

    model_name: str = "minilm"
    """A local directory (GGUF directories too), a hub id, or `minilm` / `smollm2` (the packaged backbones)."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """Tokenizer options."""
    train_global_batch_size: int = 16
    """Pairs (or regression examples) per optimizer step."""
    train_micro_batch_size: int = 16
    """Pairs per forward/backward; the global batch is `accumulation` micro-batches."""
    max_total_sequence_length: int = 256
    """Tokens per sequence (prompt + response); longer ones follow `data.overlong`."""
    precision: Precision = "float32"
    """`bfloat16`: bf16 autocast on CPU and GPU with float32 master weights and optimizer state."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """AdamW settings."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """Learning-rate schedule."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this; None: no clipping."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward (less memory, ~30% more compute)."""
    disable_dropout: bool = True
    """Set every dropout probability to 0, as TRL and OpenRLHF do for reward models: the reward is then a
    deterministic function of the weights, and attention keeps its fused kernel (BENCHMARKS.md)."""
    freeze_embeddings: bool = False
    """Keep the input embeddings fixed."""
    freeze_layers: int = 0
    """Keep the lowest this many transformer layers fixed."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters."""
    compile: bool = False
    """torch.compile each transformer block (`rmkit.models.compiled`); the first steps compile. Reward models only."""
    compile_mode: CompileMode = "default"
    """torch.compile's `mode` under `compile`; `reduce-overhead` also replays the blocks as CUDA graphs on a GPU
    (rows padded to a multiple of 32 positions), for launch-bound steps: small models, small batches."""
    compile_scope: CompileScope = "blocks"
    """What `compile` compiles as one region: `blocks`, each transformer block; `stack`, the module that runs them
    all (one graph for the forward and one for the backward instead of one per block: fewer calls, a longer
    first compile)."""
    num_threads: int | None = None
    """torch intra-op threads; None: `RMKIT_NUM_THREADS` or `OMP_NUM_THREADS` or torch's default."""
    dtensor_cfg: DTensorConfig = field(default_factory=DTensorConfig)
    """FSDP2 sharded training under torchrun (instead of DDP)."""

    def __post_init__(self):
        g, m = self.train_global_batch_size, self.train_micro_batch_size
        _check(g >= 1, "policy.train_global_batch_size", "must be >= 1")
        _check(m >= 1, "policy.train_micro_batch_size", "must be >= 1")
        _check(g % m == 0, "policy.train_global_batch_size", f"({g}) must be a multiple of train_micro_batch_size ({m})")
        _check(self.max_total_sequence_length >= 2, "policy.max_total_sequence_length", "must be >= 2")
        _check(self.max_grad_norm is None or self.max_grad_norm > 0, "policy.max_grad_norm", "must be > 0 or null")
        _check(self.freeze_layers >= 0, "policy.freeze_layers", "must be >= 0")
        _check(self.num_threads is None or self.num_threads >= 1, "policy.num_threads", "must be >= 1")
        if self.dtensor_cfg.enabled:
            _check(self.dtensor_cfg.param_dtype != "bfloat16" or self.precision == "bfloat16",
                   "policy.dtensor_cfg.param_dtype", "bfloat16 needs policy.precision: bfloat16")
            _check(not self.compile, "policy.compile",
                   "torch.compile with policy.dtensor_cfg.enabled: not implemented yet; set policy.compile=false")


@dataclass
class RMPolicyConfig(PolicyConfig):
    """`policy.*` of a reward model: the shared policy section plus the reward head."""

    reward_model_cfg: RewardModelConfig = field(default_factory=RewardModelConfig)
    """Reward model type and size."""


@dataclass
class SamplingParams:
    """How completions are drawn: `policy.generation.*` (NeMo RL's names), and every greedy sample a
    recipe writes (`temperature: 0`)."""

    max_new_tokens: int = 128
    """Tokens per completion at most; a completion that reaches it without EOS is truncated."""
    temperature: float = 1.0
    """Sampling temperature; 0: greedy. Training log-probs use the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling."""
    top_k: int | None = None
    """Top-k sampling; null: off."""
    stop_strings: list[str] | None = None
    """A completion also ends at the first of these strings (kept, with the token that completes it);
    EOS always stops."""

    def __post_init__(self):
        _check(self.max_new_tokens >= 1, "policy.generation.max_new_tokens", "must be >= 1")
        _check(self.temperature >= 0, "policy.generation.temperature", "must be >= 0 (0: greedy)")
        _check(0 < self.top_p <= 1, "policy.generation.top_p", "must be in (0, 1]")
        _check(self.top_k is None or self.top_k >= 1, "policy.generation.top_k", "must be >= 1 or null")
        _check(not self.stop_strings or all(self.stop_strings), "policy.generation.stop_strings",
               "must be non-empty strings")


@dataclass
class DataConfig:
    """`data.*`. The path `default` (and `default-val`) is the small preference set that ships with rmkit."""

    train_data_path: str = "default"
    """Training file (JSONL, JSON, Parquet) or HF datasets name."""
    val_data_paths: dict[str, str] = field(default_factory=lambda: {"default": "default-val"})
    """Validation sets by name; metrics are logged as `validation-<name>/<metric>`."""
    format: str = "auto"
    """Record format: auto, binary, ranked, aligner, helpsteer3, tulu3, hh_rlhf (preference); regression."""
    prompt_key: str = "prompt"
    """Field holding the prompt (text or messages)."""
    chosen_key: str = "chosen"
    """Field holding the preferred response."""
    rejected_key: str = "rejected"
    """Field holding the dispreferred response."""
    label_key: str = "label"
    """Field holding the regression label(s)."""
    split: str = "train"
    """The split to read when a path is a Hugging Face dataset (name or `save_to_disk` folder); files ignore it."""
    keep_ties: bool = False
    """Ranked / HelpSteer3 records whose responses tie: an error (false) or their tied pairs skipped
    (true; counted, written to `rejects-*.jsonl`)."""
    allow_empty_response: bool = False
    """An empty chosen / rejected response: an error (false) or kept as a real comparison (true)."""
    overlong: Literal["truncate", "drop"] = "truncate"
    """Sequences over `policy.max_total_sequence_length`: keep the response end (`truncate`) or `drop`."""
    pair_truncation: Literal["shared_prompt", "per_text"] = "shared_prompt"
    """How `truncate` cuts a training pair: `shared_prompt` keeps the same prompt tokens on both sides;
    `per_text` cuts each side on its own, as every scoring path (validation included) always does."""
    on_error: Literal["raise", "skip"] = "raise"
    """Bad records: stop with a message naming file:line:field, or skip them (written to `rejects.jsonl`)."""
    batching: Literal["length_grouped", "random"] = "length_grouped"
    """`length_grouped`: pairs of similar length share a batch (little padding); `random`: plain shuffle."""
    length_group_window: int = 50
    """`length_grouped`: each epoch's shuffled pairs are sorted by length within windows of this many global
    batches, then the batches are shuffled. Smaller windows mix lengths more (batches closer to random),
    larger ones pad less."""
    val_keys: dict[str, dict[str, str]] = field(default_factory=dict)
    """A validation set's own field names, when its file is laid out unlike the training file: `{hh: {}}` reads
    `val_data_paths.hh` with the standard keys (`prompt`, `chosen`, ...), `{hh: {prompt_key: question}}`
    with one key changed from them. A set without an entry is read with the training file's `*_key`s."""

    def __post_init__(self):
        _check(self.length_group_window >= 1, "data.length_group_window", "must be >= 1")
        for name, keys in self.val_keys.items():
            _check(name in self.val_data_paths, f"data.val_keys.{name}",
                   f"no validation set '{name}' in data.val_data_paths (sets: {', '.join(self.val_data_paths) or 'none'})")
            for key in keys:
                _check(key in self.key_names(), f"data.val_keys.{name}.{key}",
                       f"unknown key (known: {', '.join(self.key_names())})")

    def key_names(self) -> list[str]:
        """The field-name options (`prompt_key`, `chosen_key`, ...) of this data section."""
        return [f.name for f in dataclasses.fields(self) if f.name.endswith("_key")]

    def for_set(self, name: str | None) -> DataConfig:
        """The options that read validation set `name` (None: the training file): the training file's keys, or
        the set's own `val_keys` over the standard ones."""
        if name not in self.val_keys:
            return self
        standard = type(self)()
        return dataclasses.replace(self, **{k: getattr(standard, k) for k in self.key_names()} | self.val_keys[name])


@dataclass
class CheckpointingConfig:
    """`checkpointing.*`; the final model always goes to `<checkpoint_dir>/final/`."""

    enabled: bool = True
    """Save intermediate checkpoints (`step_<N>/`, docs/runs.md)."""
    checkpoint_dir: str = "results/rm"
    """The run's output directory."""
    metric_name: str = "val:validation-default_loss"
    """The metric that ranks checkpoints (NeMo RL naming)."""
    higher_is_better: bool = False
    """Whether a larger `metric_name` is better."""
    keep_top_k: int | None = 3
    """Checkpoints kept; None: all."""
    save_period: int = 100
    """Save every this many steps (and at the last step); a multiple of `rm.val_period` keeps the
    top-k metric fresh."""
    resume: str | None = None
    """None: start fresh; `auto`: continue from the newest valid `step_<N>` in `checkpoint_dir` (a
    fresh start when there is none; `rmkit train --resume` sets this); or the path of a `step_<N>`."""


@dataclass
class WandbConfig:
    """Weights & Biases run settings (`logger.wandb`)."""

    enabled: bool = False
    """Log every metric to a W&B run."""
    project: str = "rmkit"
    """W&B project name."""
    name: str | None = None
    """Run name; None lets W&B pick one."""
    entity: str | None = None
    """W&B team or user; None uses the logged-in default."""
    mode: str | None = None
    """"online", "offline" (files only, no network; `wandb sync` uploads them later) or "disabled";
    None follows the WANDB_MODE environment variable, else W&B's default (online)."""
    dir: str | None = None
    """Where W&B writes its files; None uses `<logger.log_dir>`."""
    tags: list[str] = field(default_factory=list)
    """Tags attached to the run."""

    def __post_init__(self):
        if self.mode not in (None, "online", "offline", "disabled"):
            raise ConfigError("logger.wandb.mode", f"must be online, offline or disabled, got {self.mode!r}")


@dataclass
class MlflowConfig:
    """MLflow run settings (`logger.mlflow`)."""

    enabled: bool = False
    """Log every metric and the config to an MLflow run."""
    tracking_uri: str | None = None
    """MLflow tracking URI: `file:<dir>` for a local file store, `sqlite:///<file>` for a local
    database, or a server `http://host:5000`; None uses `file:<logger.log_dir>/mlruns`."""
    experiment_name: str = "rmkit"
    """The experiment the run belongs to (created when missing)."""
    run_name: str | None = None
    """Run name; None lets MLflow pick one."""


@dataclass
class LoggerConfig:
    """`logger.*`."""

    log_dir: str | None = None
    """Where metrics.jsonl, TensorBoard events and plots go; None: `<checkpoint_dir>/logs`."""
    tensorboard: bool = True
    """Write TensorBoard events (skipped with a note when tensorboard is not installed)."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases."""
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    """MLflow."""
    progress_bar: bool = True
    """Show a tqdm bar with loss, accuracy and throughput."""
    plots: bool = True
    """Write training-curve and reward-histogram PNGs at the end (needs matplotlib)."""


@dataclass
class Config:
    """The whole `rmkit train` config (a reward model)."""

    rm: RMConfig = field(default_factory=RMConfig)
    policy: RMPolicyConfig = field(default_factory=RMPolicyConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpointing: CheckpointingConfig = field(default_factory=CheckpointingConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(key, message)


# ---------------------------------------------------------------- building from plain data


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, key: str) -> Any:
    """`value` (from YAML) checked against the annotation `tp`; dataclasses recurse."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a mapping, got {value!r}")
        return _build(tp, value, key)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(value, arg, key)
            except ConfigError as err:
                errors.append(err.message)
        raise ConfigError(key, f"expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(key, f"must be one of {', '.join(map(str, args))}; got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"expected a list, got {value!r}")
        if origin is tuple and len(args) != len(value):
            raise ConfigError(key, f"expected {len(args)} values, got {len(value)}")
        item_types = args if origin is tuple else [args[0]] * len(value)
        items = [_convert(v, t, f"{key}[{i}]") for i, (v, t) in enumerate(zip(value, item_types))]
        return origin(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a mapping of name: value, got {value!r}")
        return {str(k): _convert(v, args[1], f"{key}.{k}") for k, v in value.items()}
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # YAML 1.1 reads "1e-5" (no dot) as a string
            return float(value)
        except ValueError:
            pass
    if tp in (int, float, str, bool) and (type(value) is not tp):
        raise ConfigError(key, f"expected {tp.__name__}, got {value!r}")
    return value


def _build(cls: type, values: dict, prefix: str = "", base: Any = None) -> Any:
    """`values` (YAML) laid over `base` (default: `cls()`): a key not given keeps the base's value, so a
    recipe's tree states its defaults as default values (`field(default_factory=...)`) and a YAML file only
    what it changes. Nested sections merge the same way; checks run on the result."""
    base = cls() if base is None else base
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, value in values.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name not in names:
            raise ConfigError(key, f"unknown key (known: {', '.join(sorted(names))})")
        current = getattr(base, name)
        if dataclasses.is_dataclass(hints[name]) and isinstance(value, dict):
            kwargs[name] = _build(type(current), value, key, current)
        else:
            kwargs[name] = _convert(value, hints[name], key)
    try:
        return dataclasses.replace(base, **kwargs)
    except ConfigError as err:
        raise ConfigError(_key_at(err.key, prefix, names), err.message) from None


def _key_at(key: str, prefix: str, names: set[str]) -> str:
    """A section's check names its keys as the section usually sits (`policy.optimizer.lr`); built at `prefix`
    (PPO's critic: `value.optimizer`), the key is said where it is: `value.optimizer.lr`."""
    if not prefix or key.startswith(prefix + "."):
        return key
    parts = key.split(".")
    for start in range(len(parts)):
        if parts[start] in names:
            return ".".join([prefix, *parts[start:]])
    return key


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(dotted, f"'{part}' is not a section")
        node = child
    node[parts[-1]] = value


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    """`["a.b=1", "c=[1, 2]"]` -> `[("a.b", 1), ("c", [1, 2])]` (values read with `yaml.safe_load`)."""
    parsed = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(item, "an override must look like section.key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as err:
            raise ConfigError(key.strip(), f"cannot parse value {raw!r}: {err}") from None
        parsed.append((key.strip(), value))
    return parsed


def config_from_dict(values: dict | None, overrides: list[str] | None = None, tree_type: type | None = None) -> Any:
    """A config tree of `tree_type` (a recipe's top-level dataclass; default the reward-model `Config`) from a nested
    dict (YAML) with dotted overrides applied on top."""
    tree = dict(values or {})
    tree = yaml.safe_load(yaml.safe_dump(tree))  # a deep copy we may edit
    for key, value in parse_overrides(overrides or []):
        _set_dotted(tree, key, value)
    return _build(Config if tree_type is None else tree_type, tree)


class UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a key given twice in one mapping (PyYAML keeps the last one without a word,
    so a section written twice lost its first half)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"'{key}' is given twice in one mapping (the second would replace the first)",
                    key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def yaml_problem(err: yaml.YAMLError) -> str:
    """`:LINE:COLUMN: what` of a YAML error, on one line (PyYAML's own message spans several, with a snippet)."""
    mark = getattr(err, "problem_mark", None)
    where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"{where}: not valid YAML: {problem}"


def load_config(path: str | Path | None, overrides: list[str] | None = None, tree_type: type | None = None) -> Any:
    """Read a YAML config (None: all defaults) and apply `section.key=value` overrides; `tree_type` is the
    recipe's top-level dataclass (default: the reward-model `Config`)."""
    values: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError("--config", f"no such file: {path}")
        try:
            values = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader) or {}
        except yaml.YAMLError as err:
            raise ConfigError("--config", f"{path}{yaml_problem(err)}") from None
        if not isinstance(values, dict):
            raise ConfigError("--config", f"{path} must hold a mapping of sections")
    return config_from_dict(values, overrides, tree_type)


def config_to_dict(cfg: Config) -> dict:
    """Plain nested dict (tuples as lists) suitable for YAML or JSON."""
    return yaml.safe_load(yaml.safe_dump(to_plain(dataclasses.asdict(cfg)), sort_keys=False))


def to_plain(value: Any) -> Any:
    """`value` with nested dicts' keys as strings and tuples as lists: YAML's safe dumper knows lists,
    not tuples (e.g. AdamW betas)."""
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML (loadable again by `load_config`)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), encoding="utf-8")
