"""The reward-model recipe, top to bottom: config -> model -> data -> optimizer -> loop -> export.

A reward model (an encoder or a decoder with a scalar head, or K heads for regression) learns from preference
pairs with the Bradley-Terry loss `-log sigmoid(r_c - r_r - margin)` (InstructGPT eq. 1; the margin as in
Llama 2), or from labelled examples with NeMo Aligner's regression loss. One global batch per optimizer step,
split into micro-batches whose losses are divided by the global batch's counts (exact gradient accumulation,
`rmkit.trainer.accumulate`). Validation scores through the inference core, as `rmkit eval` does, every
`rm.val_period` steps on every validation set.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from rmkit import distributed as dist
from rmkit.config import Config
from rmkit.data.collate import pair_targets, regression_targets
from rmkit.data.records import MISSING_LABEL
from rmkit.data.tokenize import TokenizedExample, TokenizedPair
from rmkit.inference import RewardScorer, contract_for
from rmkit.losses import PreferenceLoss, RegressionLoss, regression_label_mask
from rmkit.models import compiled
from rmkit.models.reward import uses_last_token_pooling
from rmkit.models.reward_forward import (
    ChunkedRewards,
    SharedPromptRewards,
    chunk_overhead,
    length_grouped_rewards,
    pair_rewards,
)
from rmkit.models.setup import (
    RewardForward,
    autocast,
    load_training_classifier,
)
from rmkit.trainer.accumulate import accumulate_batch
from rmkit.trainer.datasets import item_tokens, load_run_data
from rmkit.trainer.export import export_model, reward_stats
from rmkit.trainer.lifecycle import RunResult, start_run
from rmkit.trainer.logging.plots import plot_reward_histograms, plot_training_curves
from rmkit.trainer.logging.run_logger import RunLogger
from rmkit.trainer.loop import RecipeParts, fit, sampled_state, supervised_step
from rmkit.trainer.sharding import shard_reward_model
from rmkit.validation import validate, validate_regression
from rmkit.wrappers import transformers_model

SHOWN = ("/loss", "/acc")  # the headline validation metrics printed during a run


def load_model(cfg: Config, device: torch.device):
    """`(model, tokenizer)`: the backbone as a reward model with the policy's options applied."""
    return load_training_classifier(cfg.policy, device, cfg.policy.reward_model_cfg.num_labels)


def bradley_terry_step(forward: torch.nn.Module, pairs: Sequence[TokenizedPair], micro_size: int, pad_token_id: int,
                       precision: str, device: torch.device) -> dict[str, torch.Tensor]:
    """Forward/backward of this rank's `pairs` of a global batch through `forward` (`ChunkedRewards` or
    `SharedPromptRewards`, or DDP around one); returns the global batch's `loss` and `acc` as 0-dim device
    tensors (no host sync). Gradients are left in `.grad` for the optimizer step."""
    loss_fn = PreferenceLoss()
    global_valid_seqs = dist.all_reduce_sum(torch.tensor(2.0 * len(pairs), device=device))
    overhead = chunk_overhead(forward, device)

    def run_micro(micro):
        pairs = micro or [TokenizedPair([pad_token_id], [pad_token_id])]
        targets = pair_targets(pairs)  # sample_mask [2n], margin [n]
        if micro is None:  # the placeholder row counts for nothing
            targets["sample_mask"] = torch.zeros_like(targets["sample_mask"])
        targets = _to(targets, device)
        with autocast(precision, device):
            rewards = pair_rewards(forward, pairs, pad_token_id, device, overhead)  # [2n, 1], interleaved
        return loss_fn(rewards, targets, global_valid_seqs)

    totals = accumulate_batch(forward, pairs, micro_size, lambda p: max(len(p.chosen_ids), len(p.rejected_ids)),
                              run_micro, ["loss", "accuracy"])  # each already divided by the global pair count
    return {"loss": totals["loss"], "acc": totals["accuracy"]}


def regression_step(forward: torch.nn.Module, examples: Sequence[TokenizedExample], micro_size: int, pad_token_id: int,
                    precision: str, device: torch.device) -> dict[str, torch.Tensor]:
    """Regression counterpart of `bradley_terry_step`: MSE over the present labels of the global batch
    (`RegressionLoss`, as NeMo Aligner's regression reward model)."""
    loss_fn = RegressionLoss()
    labels = torch.tensor([list(e.labels) for e in examples])
    global_valid_labels = dist.all_reduce_sum(regression_label_mask(labels, torch.ones(len(examples))).sum().to(device))
    overhead = chunk_overhead(forward, device)

    def run_micro(micro):
        rows = micro or [TokenizedExample([pad_token_id], ())]
        targets = _to(regression_targets(rows), device)  # labels [b, K], sample_mask [b]
        with autocast(precision, device):
            rewards = length_grouped_rewards(forward, [e.input_ids for e in rows], pad_token_id, device, overhead)
        if micro is None:  # the placeholder row has no labels and counts for nothing
            targets["sample_mask"] = torch.zeros_like(targets["sample_mask"])
            targets["labels"] = torch.full_like(rewards, MISSING_LABEL)
        return loss_fn(rewards, targets, None, global_valid_labels)

    return accumulate_batch(forward, examples, micro_size, lambda e: len(e.input_ids), run_micro, ["loss"])


STEPS = {"bradley_terry": bradley_terry_step, "regression": regression_step}


def _to(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def run_validation(cfg: Config, scorer: RewardScorer, data, logger: RunLogger, step: int):
    """Validate on every set, log `validation-<name>/<metric>`, return `(metrics, rewards)`."""
    max_items = cfg.rm.val_batches * cfg.rm.val_global_batch_size if cfg.rm.val_batches else None
    with compiled.eager():  # compiled blocks (policy.compile) run as written: no compiling for a few passes
        if cfg.policy.reward_model_cfg.reward_model_type == "regression":
            metrics, rewards = validate_regression(scorer, data.val, max_items)
            rewards = {name: (r[:, 0], r[:0, 0]) for name, r in rewards.items()}
        else:
            metrics, rewards = validate(scorer, data.val, max_items)
    logger.log(metrics, step)
    return metrics, rewards


def train(cfg: Config) -> RunResult:
    """Train a reward model as `cfg` says; the final model goes to `<checkpoint_dir>/final/`."""
    run = start_run(cfg, cfg.rm)  # threads, seed, torchrun, folders, the saved config
    device = run.device

    # --- model and data (tokenized once)
    model, tokenizer = load_model(cfg, device)
    # Validation scores through the inference core with the contract the export will write, so the
    # rewards it reports are the ones `rmkit eval`, `score` and `serve` give the exported model.
    reader = transformers_model(model)
    scorer = RewardScorer(reader, tokenizer, contract_for(reader, tokenizer, cfg.policy.max_total_sequence_length),
                          precision=cfg.policy.precision)
    forward = RewardForward(model)
    if cfg.policy.compile:
        compiled.compile_blocks(model, cfg.policy.compile_mode, cfg.policy.compile_scope)  # in place: parameter names (and checkpoints) are unchanged
    cuda_graphs = compiled.uses_cuda_graphs(cfg.policy.compile, cfg.policy.compile_mode, device)
    # A decoder's pairs run as one row each, their shared prompt computed once; encoders (and regression
    # rows, which have no partner) in length-planned chunks of padded rows.
    if uses_last_token_pooling(reader) and cfg.policy.reward_model_cfg.reward_model_type == "bradley_terry":
        forward = SharedPromptRewards(forward, tokenizer.pad_token_id, cuda_graphs)
    else:
        forward = ChunkedRewards(forward, cuda_graphs)
    if cfg.policy.dtensor_cfg.enabled:  # FSDP2 under torchrun: shard the model in place (gradients summed)
        shard_reward_model(model, cfg.policy, run.info)
    else:  # DDP under torchrun (gradients summed over ranks) wraps the whole chunked reward computation
        forward = dist.wrap_data_parallel(forward, run.info)
    data = load_run_data(cfg, tokenizer, run.out_dir)

    # --- sampler, optimizer, schedule, state
    state, steps = sampled_state(cfg, cfg.rm, model, data.lengths)
    step_fn = STEPS[cfg.policy.reward_model_cfg.reward_model_type]
    val_rewards: dict = {}  # the last validation's rewards: reward_stats.json and the histograms

    step = supervised_step(state, cfg.policy, data.train, lambda batch: step_fn(
        forward, batch, cfg.policy.train_micro_batch_size, tokenizer.pad_token_id, cfg.policy.precision, device),
        tokens=item_tokens, shown={"loss": "loss", "acc": "acc"})

    def validate(at: int) -> dict[str, float]:
        metrics, rewards = run_validation(cfg, scorer, data, run.logger, at)
        val_rewards.clear()
        val_rewards.update(rewards)
        return metrics

    def plots(history: list[dict], log_dir: Path) -> list:
        return [plot_training_curves(history, log_dir / "training_curves.png"),
                plot_reward_histograms(val_rewards, log_dir / "reward_histograms.png")]

    # --- the loop, the last checkpoint, the export (rank 0) and plots
    return fit(run, state, steps, cfg.rm, RecipeParts(
        action=f"training {cfg.policy.model_name}", length=f"{steps} steps of {cfg.policy.train_global_batch_size}",
        step=step, validate=validate if data.val else None, shown=SHOWN, tokenizer=tokenizer,
        export=lambda whole, folder: export_model(whole, tokenizer, folder, cfg, reward_stats(val_rewards),
                                                  scorer.contract),
        load_unsharded=lambda: load_model(cfg, torch.device("cpu"))[0], plots=plots))
