"""FSDP2 for the training recipes (`policy.dtensor_cfg.enabled` under torchrun): which modules become sharded
units, forwards kept in step across ranks, and the whole model back on rank 0 for the export.

Every FSDP2 forward and backward all-gathers each unit's parameters, so every rank must run as many of them
as the others: a rank with less work runs placeholder micro-batches (`same_count`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rmkit import distributed as dist
from rmkit.config import PolicyConfig
from rmkit.errors import ConfigError
from rmkit.models.reward import uses_last_token_pooling
from rmkit.models.setup import transformer_layers
from rmkit.wrappers import transformers_model


def _blocks(reader: torch.nn.Module) -> torch.nn.ModuleList:
    layers = transformer_layers(reader)
    if layers is None:
        raise ConfigError("policy.dtensor_cfg.enabled", f"cannot find the transformer layers of {type(reader).__name__}")
    return layers


def _fully_shard(reader: torch.nn.Module, units: list[torch.nn.Module], policy: PolicyConfig,
                 info: dist.DistInfo) -> None:
    dtensor = policy.dtensor_cfg
    param_dtype = dtensor.param_dtype if dtensor.param_dtype != "auto" else policy.precision
    dist.fully_shard_model(reader, units, info, dtensor.reshard_after_forward, dtensor.cpu_offload,
                           getattr(torch, param_dtype))


def shard_reward_model(model: torch.nn.Module, policy: PolicyConfig, info: dist.DistInfo) -> None:
    """The sharded units are what the reward step calls on their own: each transformer block, the input
    embeddings (the loop looks them up first, `ChunkedRewards`), a decoder's backbone (its final norm) and
    score head; then the transformers model that validation scores with holds the rest (under LoRA: peft's
    base model, the adapters inside their blocks)."""
    reader = transformers_model(model)
    units = [reader.get_input_embeddings(), *_blocks(reader)]
    if uses_last_token_pooling(reader):
        units += [getattr(reader, reader.base_model_prefix), reader.score]
    _fully_shard(reader, units, policy, info)


def shard_policy(model: torch.nn.Module, policy: PolicyConfig, info: dist.DistInfo) -> None:
    """A causal LM: each transformer block is a unit; the transformers model (under LoRA: peft's base model)
    holds the rest, the input embeddings and the LM head together, since most small policies tie them (one
    parameter cannot live in two units)."""
    reader = transformers_model(model)
    _fully_shard(reader, list(_blocks(reader)), policy, info)


def same_count(micros: list, module: torch.nn.Module) -> list:
    """`micros` with placeholder (None) micro-batches appended up to the busiest rank's count when `module`
    is sharded; as it is otherwise (DDP communicates in the last backward only and needs none)."""
    if not dist.is_sharded(module):
        return micros
    most = int(dist.all_reduce(torch.tensor(len(micros)), "max"))
    return micros + [None] * (most - len(micros))


def gather_full_model(model: torch.nn.Module, load_unsharded: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """The model to export: `model` itself unless sharded; then every rank sends its shards and rank 0 loads
    the whole state dict into `load_unsharded()` (a fresh model as the recipe builds it, on the CPU). Other
    ranks get `model` back and must not export it. Call on every rank."""
    if not dist.is_sharded(model):
        return model
    state_dict = dist.full_state_dict(model)
    if not dist.is_main():
        return model
    whole = load_unsharded()
    whole.load_state_dict(state_dict)
    return whole
