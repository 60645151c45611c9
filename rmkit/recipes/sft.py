"""The supervised fine-tuning recipe, top to bottom: config -> model -> data -> optimizer -> loop -> export.

A policy (any causal LM) learns to say what demonstrations say: the NLL of their trained tokens (the
assistant turns by default), divided by the global batch's trained-token count (`NLLLoss`, docs/design.md's
normalization), so gradient accumulation (`rmkit.trainer.accumulate`) and data parallelism are exact.
Batches are padded on the right (`attention_mask`) or, with `sft.sequence_packing`, padding-free: a
micro-batch's sequences end to end in one row `[1, T]` whose `position_ids` restart at 0 for each sequence;
with no attention mask, transformers reads the restarts as sequence boundaries and keeps attention within
each sequence. Every sequence's first token carries no loss, so nothing is learned across a boundary.
Validation every `sft.val_period` steps reports the loss, token accuracy and tokens/s per set and writes
greedy answers to held-out prompts to `<log_dir>/samples.jsonl`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch

from rmkit import distributed as dist
from rmkit.config import SamplingParams
from rmkit.data.policy_tokenize import DemonstrationIds
from rmkit.generation import generate_completions
from rmkit.losses import NLLLoss
from rmkit.models.policy import load_training_policy
from rmkit.models.setup import autocast
from rmkit.recipes.configs import SFTTree
from rmkit.trainer.accumulate import accumulate_batch, plan_micro_batches
from rmkit.trainer.datasets import load_demonstration_set, load_sets
from rmkit.trainer.export import export_policy
from rmkit.trainer.lifecycle import RunResult, start_run
from rmkit.trainer.logging.plots import plot_training_curves
from rmkit.trainer.logging.run_logger import append_samples
from rmkit.trainer.loop import RecipeParts, fit, sampled_state, supervised_step
from rmkit.trainer.sharding import shard_policy

SHOWN = ("/loss", "/token_acc")  # the headline validation metrics printed during a run


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

    def run_micro(micro):
        batch = _device_batch(micro or _placeholder(pad_token_id), pad_token_id, packed, device)
        with autocast(precision, device):
            logits = forward_logits(forward, batch)
        loss, metrics = loss_fn(logits, batch, None, global_valid_toks)
        metrics["correct"] = correct_tokens(logits.detach(), batch)
        return loss, metrics

    totals = accumulate_batch(forward, items, micro_size, lambda d: d.length, run_micro, ["loss", "correct"])
    return {"loss": totals["loss"], "token_acc": totals["correct"] / global_valid_toks}


@torch.no_grad()
def evaluate(model: torch.nn.Module, items: Sequence[DemonstrationIds], micro_size: int, pad_token_id: int,
             precision: str, device: torch.device, packed: bool = False) -> dict[str, float]:
    """`loss` (mean NLL per trained token), `token_acc`, `num_tokens` (trained) and `tokens_per_s` (all tokens
    fed) of a validation set, each rank scoring its shard and the sums all-reduced."""
    was_training = model.training
    model.eval()
    loss_fn, start = NLLLoss(), time.perf_counter()
    sums = torch.zeros(4, device=device)  # nll, correct, trained tokens, tokens fed
    for micro in plan_micro_batches(dist.shard(items), micro_size, model, lambda d: d.length):
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


def run_validation(cfg: SFTTree, model, tokenizer, val: dict[str, list], logger, step: int, log_dir: Path) -> dict:
    """Every set's `validation-<name>/{loss, token_acc, num_tokens, tokens_per_s}`, logged; then the samples."""
    sft, device = cfg.sft, next(model.parameters()).device
    limit = sft.val_batches * sft.val_global_batch_size if sft.val_batches else None
    metrics = {}
    for name, items in val.items():
        result = evaluate(model, items[:limit], sft.val_micro_batch_size, tokenizer.pad_token_id,
                          cfg.policy.precision, device, sft.sequence_packing)
        metrics.update({f"validation-{name}/{k}": v for k, v in result.items()})
    logger.log(metrics, step)
    if sft.num_sample_generations and (dist.is_main() or dist.is_sharded(model)):  # FSDP2: every rank generates
        write_samples(cfg, model, tokenizer, val, step, log_dir)
    return metrics


def write_samples(cfg: SFTTree, model, tokenizer, val: dict[str, list], step: int, log_dir: Path) -> None:
    """Greedy answers to the first `sft.num_sample_generations` prompts of each set, with the demonstration's
    own answer as `reference` (`append_samples`; a sharded model generates on every rank: each forward
    all-gathers)."""
    params = SamplingParams(max_new_tokens=cfg.sft.sample_max_new_tokens, temperature=0.0)
    for name, items in val.items():
        held_out = items[:cfg.sft.num_sample_generations]
        if not held_out:
            continue
        with autocast(cfg.policy.precision, next(model.parameters()).device):
            answers = generate_completions(model, tokenizer, [d.input_ids[:d.prompt_length] for d in held_out], params)
        append_samples(log_dir, step, [
            {"set": name, "source": d.source, "prompt": tokenizer.decode(d.input_ids[:d.prompt_length]), "completion": completion,
             "reference": tokenizer.decode(d.input_ids[d.prompt_length:], skip_special_tokens=True)}
            for d, completion in zip(held_out, answers.text)])


def train(cfg: SFTTree) -> RunResult:
    """Fine-tune a policy on demonstrations as `cfg` says; the final model goes to `<checkpoint_dir>/final/`."""
    run = start_run(cfg, cfg.sft)  # threads, seed, torchrun, folders, the saved config
    device = run.device

    # --- model and data (tokenized once)
    model, tokenizer = load_training_policy(cfg.policy, device)
    if cfg.policy.dtensor_cfg.enabled:  # FSDP2 under torchrun: shard the model in place (gradients summed)
        shard_policy(model, cfg.policy, run.info)
        forward = model
    else:  # DDP under torchrun: gradients summed over ranks
        forward = dist.wrap_data_parallel(model, run.info)
    train_items, val = load_sets(cfg.data, run.out_dir, lambda ds: load_demonstration_set(cfg, ds, tokenizer),
                                 "demonstrations")

    # --- sampler, optimizer, schedule, state
    state, steps = sampled_state(cfg, cfg.sft, model, [d.length for d in train_items])

    step = supervised_step(state, cfg.policy, train_items, lambda batch: sft_step(
        forward, batch, cfg.policy.train_micro_batch_size, tokenizer.pad_token_id, cfg.policy.precision, device,
        cfg.sft.sequence_packing), tokens=lambda d: d.length, shown={"loss": "loss", "acc": "token_acc"})

    # --- the loop, the last checkpoint, the export (rank 0) and plots
    return fit(run, state, steps, cfg.sft, RecipeParts(
        action=f"fine-tuning {cfg.policy.model_name}",
        length=f"{steps} steps of {cfg.policy.train_global_batch_size} sequences", step=step,
        validate=(lambda at: run_validation(cfg, model, tokenizer, val, run.logger, at, run.log_dir)) if val else None,
        shown=SHOWN, tokenizer=tokenizer, items="sequences",
        export=lambda whole, folder: export_policy(whole, tokenizer, folder, cfg),
        load_unsharded=lambda: load_training_policy(cfg.policy, torch.device("cpu"))[0],
        plots=lambda history, log_dir: [plot_training_curves(history, log_dir / "training_curves.png",
                                                             ("loss", "token_acc"))]))
