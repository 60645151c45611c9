"""A policy's passes over a rollout batch: its logits at the completion tokens (each prompt computed once for all
its completions), per-token log-probs, the rows cut for micro-batches, and the frozen reference policy.
"""

from __future__ import annotations

import contextlib
import copy

import torch

from rmkit import distributed as dist
from rmkit.losses.logprobs import next_token_logprobs
from rmkit.models.setup import autocast
from rmkit.models.shared_prefix import Group, shared_prefix_logits
from rmkit.trainer.sharding import shard_policy


def policy_logits(model, batch: dict, temperature: float, precision: str) -> tuple[torch.Tensor, dict]:
    """`(logits [B, W, V], view)`: the policy's logits divided by the sampling temperature (the distribution the
    rollouts were drawn from, so training log-probs compare with the generation log-probs) at the rows of
    `view = continuation_view(batch)`, the positions that predict a completion token; what a loss or a
    log-prob pass reads is `view`, not `batch`. The completions of one prompt share it: each group runs as
    one sequence with the prompt computed once, several groups packed to a row (`rmkit.models.shared_prefix`),
    and the output layer runs at the view's positions only; the logits equal a plain forward's within float
    rounding."""
    device = batch["input_ids"].device
    with autocast(precision, device):  # padding is masked: any id will do
        logits = shared_prefix_logits(model, prompt_groups(batch), pad_token_id=0, continuations_only=True)
    return (logits / temperature if temperature != 1.0 else logits), continuation_view(batch)


def continuation_view(batch: dict) -> dict:
    """The rows from their last prompt token on (`[last prompt token, completion]`; from the first token after
    an empty prompt), left-aligned and right-padded to the longest: every per-token tensor `[B, S]` shifted
    alike, so each stays aligned with `input_ids` (position t of the view: log p(token t | what precedes it));
    per-row tensors as they are, `prompt_length` the view's own (1, or 0). Losses over completion tokens
    give the same sums over the view as over the full rows, and the prompt's other positions are not
    computed."""
    start = continuation_start(batch)
    width = int((batch["attention_mask"].sum(1) - start).max())
    index = start[:, None] + torch.arange(width, device=start.device)
    view = {}
    for key, value in batch.items():
        if value.dim() == 2:  # zeros past each row's end: padding, masked
            view[key] = torch.cat([value, value.new_zeros(len(value), width)], 1).gather(1, index.to(value.device))
        else:
            view[key] = value
    view["prompt_length"] = (batch["prompt_length"] > 0).to(batch["prompt_length"].dtype)
    return view


def continuation_start(batch: dict) -> torch.Tensor:
    """`[B]`: where each row's `continuation_view` begins (its last prompt token; 0 after an empty prompt)."""
    return (batch["prompt_length"] - 1).clamp(min=0)


def from_continuation_view(values: torch.Tensor, batch: dict) -> torch.Tensor:
    """`[B, S]` per-token `values` `[B, W]` of `continuation_view(batch)` put back at the rows' own positions
    (0 before each row's view and at padding)."""
    width, start = values.shape[1], continuation_start(batch).to(values.device)
    index = start[:, None] + torch.arange(width, device=values.device)
    real = torch.arange(width, device=values.device) < (batch["attention_mask"].sum(1).to(values.device) - start)[:, None]
    out = values.new_zeros(len(values), batch["input_ids"].shape[1] + width)
    return out.scatter_(1, index, values * real)[:, :batch["input_ids"].shape[1]]


def prompt_groups(batch: dict) -> list[Group]:
    """The rows as `(prompt ids, [completion ids, ...])`, one group per run of consecutive rows with the same
    `group_index`, in row order."""
    groups: list[Group] = []
    lengths, group_ids = batch["attention_mask"].sum(1).tolist(), batch["group_index"].tolist()
    for row, (ids, start, length, group) in enumerate(zip(batch["input_ids"].tolist(), batch["prompt_length"].tolist(),
                                                          lengths, group_ids)):
        if row and group == group_ids[row - 1]:
            groups[-1][1].append(ids[start:length])
        else:
            groups.append((ids[:start], [ids[start:length]]))
    return groups


@torch.no_grad()
def batch_logprobs(model, batch: dict, micro_batch_size: int, temperature: float, precision: str) -> torch.Tensor:
    """`[N, S]` log-probs of every row's completion tokens under `model`, aligned with input_ids (0 at the
    prompt's positions, which no loss reads)."""
    out = torch.zeros(batch["input_ids"].shape, dtype=torch.float32)
    device = next(model.parameters()).device
    for start in range(0, len(out), micro_batch_size):
        micro = slice_rows(batch, start, start + micro_batch_size, device)
        logits, view = policy_logits(model, micro, temperature, precision)
        logprobs = from_continuation_view(row_logprobs(logits, view["input_ids"]), micro)
        out[start:start + micro_batch_size, :logprobs.shape[1]] = logprobs.cpu()
    return out


def reference_logprobs(reference, model, batch: dict, policy, temperature: float) -> torch.Tensor:
    """`batch_logprobs` under the reference policy (`reference`: `reference_policy`'s factory; its model None:
    `model` itself, LoRA's adapters disabled)."""
    with reference() as ref_model:
        return batch_logprobs(model if ref_model is None else ref_model, batch, policy.train_micro_batch_size,
                              temperature, policy.precision)


@torch.no_grad()
def row_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """`[B, S]` float32 log-probs of `input_ids` under `logits` `[B, S, V]`, aligned with input_ids (0 at
    position 0): the layout of `prev_logprobs` and `reference_policy_logprobs`."""
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=logits.device)
    out[:, 1:] = next_token_logprobs(logits, input_ids).float()
    return out


def slice_rows(batch: dict, start: int, stop: int, device: torch.device | None = None) -> dict:
    """Rows `start:stop` of every tensor, cut to the rows' longest real length (less padding)."""
    width = int(batch["attention_mask"][start:stop].sum(1).max())
    return {k: (v[start:stop, :width] if v.dim() == 2 else v[start:stop]).to(device or v.device)
            for k, v in batch.items()}


def reference_policy(model, policy, info: dist.DistInfo, needed: bool):
    """A context manager factory giving the reference policy (the initial weights), or None when not `needed`
    (no KL term). LoRA: the same model with its adapters disabled (no second copy); else a frozen deep copy,
    taken before any checkpoint is restored (and before the policy is sharded), sharded like the policy
    under FSDP2."""
    if not needed:
        return None
    if policy.lora.enabled:
        return lambda: model.disable_adapter()
    frozen = copy.deepcopy(model).eval().requires_grad_(False)
    if policy.dtensor_cfg.enabled:
        shard_policy(frozen, policy, info)
    return lambda: contextlib.nullcontext(frozen)
