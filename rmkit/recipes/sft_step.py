"""One SFT optimizer step over one global batch of demonstrations, and validation over a set.

The loss of each micro-batch is the NLL of its trained tokens divided by the *global* batch's trained-token
count (`NLLLoss`, docs/design.md's normalization), so the accumulated gradient is the full-batch mean NLL
over the global batch's trained tokens, whatever the micro-batch size and however many ranks. Batches are
padded on the right (`attention_mask`) or, with packing, padding-free: a micro-batch's sequences end to end
in one row `[1, T]` whose `position_ids` restart at 0 for each sequence; with no attention mask, transformers
reads the restarts as sequence boundaries and keeps attention within each sequence (its packed-sequence
mask). Every sequence's first token carries no loss (its mask is 0), so nothing is learned across a boundary.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from rmkit import distributed as dist
from rmkit.data.policy_tokenize import DemonstrationIds
from rmkit.losses import NLLLoss
from rmkit.models.setup import autocast
from rmkit.trainer.sharding import same_count


def micro_batches(items: Sequence[DemonstrationIds], micro_size: int) -> list[list[DemonstrationIds]]:
    """Longest first: each micro-batch pads only to its own longest sequence."""
    ordered = sorted(items, key=lambda d: d.length, reverse=True)
    return [ordered[i : i + micro_size] for i in range(0, len(ordered), micro_size)]


def collate(items: Sequence[DemonstrationIds], pad_token_id: int, packed: bool) -> dict[str, torch.Tensor]:
    """`input_ids`, `token_mask` (`[n, S]` padded right, or `[1, T]` packed) and `sample_mask`; the model's
    own inputs are `attention_mask` (padded) or `position_ids` (packed)."""
    if packed:
        ids = torch.tensor([t for d in items for t in d.input_ids])[None]
        return {"input_ids": ids, "token_mask": torch.tensor([m for d in items for m in d.token_mask])[None],
                "position_ids": torch.cat([torch.arange(d.length) for d in items])[None],
                "sample_mask": torch.ones(1)}
    width = max(d.length for d in items)
    ids = torch.full((len(items), width), pad_token_id, dtype=torch.long)
    token_mask, attention_mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for row, d in enumerate(items):
        ids[row, : d.length] = torch.tensor(d.input_ids)
        token_mask[row, : d.length] = torch.tensor(d.token_mask)
        attention_mask[row, : d.length] = 1
    return {"input_ids": ids, "token_mask": token_mask, "attention_mask": attention_mask,
            "sample_mask": torch.ones(len(items))}


def forward_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """`[B, S, V]` next-token logits of a collated batch."""
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
    return model(**inputs, use_cache=False).logits


def correct_tokens(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """How many trained tokens the logits' argmax predicts (0-dim float)."""
    hits = logits[:, :-1].argmax(-1) == batch["input_ids"][:, 1:]
    return (hits * batch["token_mask"][:, 1:]).sum().float()


def _placeholder(pad_token_id: int) -> list[DemonstrationIds]:
    """A micro-batch of one 2-token row with no trained token: it adds nothing to a loss or a count."""
    return [DemonstrationIds([pad_token_id] * 2, [0, 0], 0)]


def _device_batch(micro, pad_token_id: int, packed: bool, device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in collate(micro, pad_token_id, packed).items()}


def sft_step(forward: torch.nn.Module, items: Sequence[DemonstrationIds], micro_size: int, pad_token_id: int,
             precision: str, device: torch.device, packed: bool = False) -> dict[str, torch.Tensor]:
    """Forward/backward of this rank's share `items` of a global batch; returns the global batch's `loss`
    (mean NLL per trained token) and `token_acc` as 0-dim device tensors; gradients are left in `.grad`."""
    loss_fn = NLLLoss()
    trained = float(sum(sum(d.token_mask) for d in items))
    global_valid_toks = dist.all_reduce_sum(torch.tensor(trained, device=device))
    loss_sum, correct = torch.zeros((), device=device), torch.zeros((), device=device)
    # A rank whose share of a short last global batch is empty runs one placeholder row with no trained
    # token, so it still joins DDP's gradient all-reduce (with zero gradients); under FSDP2 a rank with fewer
    # micro-batches than the busiest runs placeholder ones, so every rank runs as many forwards.
    micros = same_count(micro_batches(items, micro_size) or [None], forward)
    for i, micro in enumerate(micros):
        batch = _device_batch(micro or _placeholder(pad_token_id), pad_token_id, packed, device)
        with dist.sync_gradients(forward, sync=i == len(micros) - 1):  # DDP reduces after the last one
            with autocast(precision, device):
                logits = forward_logits(forward, batch)
            loss, metrics = loss_fn(logits, batch, None, global_valid_toks)
            loss.backward()
        loss_sum += metrics["loss"]
        correct += correct_tokens(logits.detach(), batch)
    loss_sum, correct = dist.all_reduce_sum(torch.stack([loss_sum, correct]))
    return {"loss": loss_sum, "token_acc": correct / global_valid_toks}


@torch.no_grad()
def evaluate(model: torch.nn.Module, items: Sequence[DemonstrationIds], micro_size: int, pad_token_id: int,
             precision: str, device: torch.device, packed: bool = False) -> dict[str, float]:
    """`loss` (mean NLL per trained token), `token_acc`, `num_tokens` (trained) and `tokens_per_s` (all tokens
    fed) of a validation set, each rank scoring its shard and the sums all-reduced."""
    was_training = model.training
    model.eval()
    loss_fn, start = NLLLoss(), time.perf_counter()
    sums = torch.zeros(4, device=device)  # nll, correct, trained tokens, tokens fed
    for micro in same_count(micro_batches(dist.shard(items), micro_size), model):
        batch = _device_batch(micro or _placeholder(pad_token_id), pad_token_id, packed, device)
        with autocast(precision, device):
            logits = forward_logits(model, batch)
        nll, metrics = loss_fn(logits, batch, None, 1.0)  # divided by 1: the sum of the tokens' NLL
        sums += torch.stack([nll.float(), correct_tokens(logits, batch), metrics["num_unmasked_tokens"].float(),
                             torch.tensor(float(sum(d.length for d in micro or [])), device=device)])
    seconds = torch.tensor(time.perf_counter() - start, device=device)
    model.train(was_training)
    nll, correct, trained, fed = dist.all_reduce_sum(sums).tolist()
    seconds = float(dist.all_reduce(seconds, "max"))
    return {"loss": nll / max(trained, 1), "token_acc": correct / max(trained, 1), "num_tokens": trained,
            "tokens_per_s": fed / max(seconds, 1e-9)}
