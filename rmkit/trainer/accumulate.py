"""Gradient accumulation, the one way every recipe runs a global batch: cut this rank's share into
micro-batches, run forward and backward on each, and let the gradients add up.

Each micro-batch's loss is divided by the *global* batch's counts (docs/design.md, "Normalization"), so
the accumulated gradient is the full-batch gradient whatever the micro-batch size and however many ranks.
DDP and FSDP2 reduce gradients in the last micro-batch's backward only. Two rules keep data-parallel ranks
in step: a rank whose share of a short last batch is empty runs one placeholder micro-batch (a row that
counts for nothing, so it still joins the gradient all-reduce), and under FSDP2, whose every forward
all-gathers parameters, a rank with fewer micro-batches than the busiest runs placeholder ones. A
placeholder is `None` in the plan; the recipe's micro-batch function turns it into its own empty row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from rmkit import distributed as dist
from rmkit.losses.protocol import reduce_metrics
from rmkit.trainer.sharding import same_count


def plan_micro_batches(items: Sequence, size: int, module: torch.nn.Module,
                       length: Callable[[Any], int] | None = None) -> list[list | None]:
    """This rank's `items` cut into micro-batches of `size`, longest first when `length` is given (each
    micro-batch pads only to its own longest item, and the first shows the peak memory at once); `None`
    placeholders as the module docstring says."""
    ordered = sorted(items, key=length, reverse=True) if length is not None else list(items)
    micros = [ordered[i:i + size] for i in range(0, len(ordered), size)]
    return same_count(micros or [None], module)


def accumulate(forward: torch.nn.Module, micros: Sequence,
               run_micro: Callable[[Any], tuple[torch.Tensor, dict]]) -> list[dict]:
    """Forward and backward of every micro-batch of one global batch: `run_micro(micro)` returns the
    micro-batch's loss (already divided by the global counts) and its metrics; its backward runs inside
    `forward`'s gradient-sync context (reduced over ranks at the last one). Returns each micro-batch's
    metrics; the gradients are left in `.grad` for the optimizer step."""
    metrics = []
    for i, micro in enumerate(micros):
        with dist.sync_gradients(forward, sync=i == len(micros) - 1):
            loss, micro_metrics = run_micro(micro)
            loss.backward()
        metrics.append(micro_metrics)
    return metrics


def global_metrics(micro_metrics: list[dict], keys: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
    """The global batch's metrics: the micro-batches' combined (`reduce_metrics`: sums, `*_min` / `*_max`
    extremes), then summed over ranks in one all-reduce (each rank holds its part of a globally normalized
    value). `keys`: only these."""
    metrics = reduce_metrics(micro_metrics)
    names = list(keys if keys is not None else metrics)
    values = dist.all_reduce_sum(torch.stack([torch.as_tensor(metrics[k]).float() for k in names]))
    return dict(zip(names, values))


def accumulate_batch(forward: torch.nn.Module, items: Sequence, micro_size: int, length: Callable[[Any], int],
                     run_micro: Callable[[Any], tuple[torch.Tensor, dict]], keys: Sequence[str]) -> dict[str, torch.Tensor]:
    """This rank's share `items` of a global batch through `forward`, longest first in micro-batches of `micro_size`
    (`plan_micro_batches`), forward and backward each (`accumulate`); returns the global batch's metrics `keys`
    (`global_metrics`)."""
    return global_metrics(accumulate(forward, plan_micro_batches(items, micro_size, forward, length), run_micro), keys)
