"""`policy.compile`: torch.compile of a reward model's transformer blocks, one block at a time or all together.

With `policy.compile_scope: blocks`, each block (`transformer_layers`) is compiled in place (regional
compilation): the blocks of a model share one compiled graph, compiled once for any sequence length
(`dynamic=True`), and what runs between them (the embedding lookup, the attention mask, the pooling and the
head) stays eager, so nothing else the training step does (first-token last layer, shared-prompt rows,
chunking) has to trace. With `stack`, the module that runs the blocks one after another (BERT's encoder, a
Llama's base model) is compiled instead: one region per forward, whose every call costs a guard check and
autograd's wrapper once instead of once per block (on an H200, each of MiniLM's six compiled blocks under CUDA
graphs cost about 1 ms of CPU a step, forward and backward, in a 16 ms step that kept the GPU busy 4.2 ms; as one
stack, MiniLM trained 2.26x TRL's pairs/s), for a longer first compile. Parameter names, and so checkpoints and
exports, are unchanged either way.

`policy.compile_mode` is torch.compile's `mode`. `reduce-overhead` also replays each block as a CUDA graph on
a GPU: one launch instead of dozens per block, for steps that are launch-bound (a small model at a small batch:
MiniLM at 16 pairs spent 4.6 ms of a 37 ms step computing, BENCHMARKS.md). A CUDA graph is recorded for each
input shape it sees, so rows are then padded to a multiple of `CUDA_GRAPH_LENGTH_MULTIPLE` positions (a few
shapes, each recorded once), and every forward starts a new graph step (`begin_step`). On a CPU the mode
compiles as `default` does.

Validation and scoring run the blocks eagerly (`eager`): no-grad forwards of every length would each compile
or record again for a few passes.
"""

from __future__ import annotations

import contextlib
from typing import get_args

import torch

from rmkit.config import CompileMode, CompileScope
from rmkit.errors import ConfigError
from rmkit.models.setup import transformer_layers
from rmkit.wrappers import transformers_model

MODES = get_args(CompileMode)  # `policy.compile_mode`'s values, as the config checks them
SCOPES = get_args(CompileScope)  # `policy.compile_scope`'s
CUDA_GRAPH_MODES = ("reduce-overhead",)
# Positions a row is padded to a multiple of when blocks replay CUDA graphs: at 256 tokens, 8 shapes per row
# count, each recorded once, for at most 31 padded positions a row.
CUDA_GRAPH_LENGTH_MULTIPLE = 32


def compile_blocks(model: torch.nn.Module, mode: str, scope: str = "blocks") -> None:
    """Compile the transformer blocks of `model` (plain, DDP-wrapped or peft) in place with torch.compile's
    `mode`: each on its own (`scope` "blocks") or the module that runs them all ("stack")."""
    if mode not in MODES:
        raise ConfigError("policy.compile_mode", f"{mode!r} is not one of {', '.join(MODES)}")
    if scope not in SCOPES:
        raise ConfigError("policy.compile_scope", f"{scope!r} is not one of {', '.join(SCOPES)}")
    inner = transformers_model(model)
    layers = transformer_layers(inner)
    if layers is None:
        raise ConfigError("policy.compile", f"cannot find the transformer blocks of {type(inner).__name__} to compile; "
                          "set policy.compile=false")
    for region in (layers if scope == "blocks" else [_stack(inner, layers)]):
        region.compile(dynamic=True, mode=mode)


def _stack(model: torch.nn.Module, layers: torch.nn.ModuleList) -> torch.nn.Module:
    """The module of `model` that holds `layers` as a child: the one whose forward runs them in turn."""
    return next(module for module in model.modules() if any(child is layers for child in module.children()))


def has_compiled_blocks(model: torch.nn.Module) -> bool:
    """Whether `compile_blocks` compiled `model`'s blocks (plain, DDP-wrapped or peft), in either scope."""
    inner = transformers_model(model)
    layers = transformer_layers(inner)
    if layers is None:
        return False
    return any(getattr(region, "_compiled_call_impl", None) is not None for region in [*layers, _stack(inner, layers)])


def uses_cuda_graphs(compile_enabled: bool, mode: str, device: torch.device) -> bool:
    """True when compiled blocks replay CUDA graphs: rows must then come in few shapes."""
    return compile_enabled and mode in CUDA_GRAPH_MODES and device.type == "cuda"


def padded_length(length: int, multiple: int | None) -> int:
    """`length` rounded up to a multiple of `multiple` (None: unchanged)."""
    return length if not multiple else -(-length // multiple) * multiple


def begin_step() -> None:
    """Tell CUDA graph replay that a new forward begins: the previous forward's graph outputs may be reused."""
    torch.compiler.cudagraph_mark_step_begin()


def eager() -> contextlib.AbstractContextManager:
    """Within the block compiled modules run their original eager code (validation, scoring)."""
    return torch.compiler.set_stance("force_eager")
