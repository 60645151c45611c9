"""The reward-model training recipe, top to bottom: config -> model -> data -> optimizer -> loop -> export.

One global batch per optimizer step, split into micro-batches whose losses are normalized by the global
batch's counts (exact gradient accumulation). Validation runs every `rm.val_period` steps on every
validation set. The loop's whole state lives in one `TrainState`.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rmkit import distributed as dist
from rmkit.config import Config, save_config
from rmkit.inference import RewardScorer, contract_for
from rmkit.models import load_reward_model, load_tokenizer
from rmkit.models.reward import ensure_pad_token, uses_last_token_pooling
from rmkit.models.setup import RewardForward, prepare_model, resolve_model_name
from rmkit.recipes.rm_step import STEPS, ChunkedRewards, SharedPromptRewards
from rmkit.trainer.export import export_model, reward_stats
from rmkit.trainer.optim import build_optimizer, build_scheduler, optimizer_step
from rmkit.trainer.plots import plot_reward_histograms, plot_training_curves
from rmkit.trainer.progress import ProgressBar, StepWindow
from rmkit.trainer.resume import (
    resolve_resume,
    restore_rng,
    restore_training_state,
    save_training_checkpoint,
)
from rmkit.trainer.run_data import item_tokens, load_run_data, make_sampler
from rmkit.trainer.run_log import RunLogger, open_logger
from rmkit.trainer.sharding import gather_full_model, shard_reward_model
from rmkit.trainer.state import TrainingDiverged, TrainState, seed_everything, set_threads, total_steps
from rmkit.validation import validate, validate_regression
from rmkit.wrappers import transformers_model


@dataclass
class TrainResult:
    """What a finished run produced."""

    final_dir: Path
    log_dir: Path
    steps: int
    val_metrics: dict[str, float] = field(default_factory=dict)
    pairs_per_s: float = 0.0
    tokens_per_s: float = 0.0
    plots: list[Path] = field(default_factory=list)


def load_model(cfg: Config, device: torch.device):
    """`(model, tokenizer)`: the backbone as a reward model with the policy's options applied."""
    policy = cfg.policy
    name = resolve_model_name(policy.model_name)
    model, tokenizer = load_reward_model(name, num_labels=policy.reward_model_cfg.num_labels,
                                         chat_template=policy.tokenizer.chat_template)
    if policy.tokenizer.name is not None:
        tokenizer = load_tokenizer(resolve_model_name(policy.tokenizer.name), policy.tokenizer.chat_template)
        ensure_pad_token(model, tokenizer)
    model = prepare_model(model, policy).to(device)
    model.train()
    return model, tokenizer


def run_validation(cfg: Config, scorer: RewardScorer, data, logger: RunLogger, step: int):
    """Validate on every set, log `validation-<name>/<metric>`, return `(metrics, rewards)`."""
    max_items = cfg.rm.val_batches * cfg.rm.val_global_batch_size if cfg.rm.val_batches else None
    if cfg.policy.reward_model_cfg.reward_model_type == "regression":
        metrics, rewards = validate_regression(scorer, data.val, max_items)
        rewards = {name: (r[:, 0], r[:0, 0]) for name, r in rewards.items()}
    else:
        metrics, rewards = validate(scorer, data.val, max_items)
    logger.log(metrics, step)
    return metrics, rewards



def train(cfg: Config) -> TrainResult:
    """Train a reward model as `cfg` says; the final model goes to `<checkpoint_dir>/final/`."""
    # --- setup: threads, seeds, output folders, the resolved config
    set_threads(cfg.policy.num_threads)
    seed_everything(cfg.rm.seed)
    info = dist.init_distributed()  # a no-op without torchrun; rank 0 alone writes and prints
    device = info.device
    out_dir = Path(cfg.checkpointing.checkpoint_dir)
    log_dir = Path(cfg.logger.log_dir) if cfg.logger.log_dir else out_dir / "logs"
    if dist.is_main():
        save_config(cfg, out_dir / "config.yaml")

    # --- model and data (tokenized once)
    model, tokenizer = load_model(cfg, device)
    # Validation scores through the inference core with the contract the export will write, so the
    # rewards it reports are the ones `rmkit eval`, `score` and `serve` give the exported model.
    reader = transformers_model(model)
    scorer = RewardScorer(reader, tokenizer, contract_for(reader, tokenizer, cfg.policy.max_total_sequence_length),
                          precision=cfg.policy.precision)
    forward = RewardForward(model)
    if cfg.policy.compile:
        forward.compile(dynamic=True)  # in place: parameter names (and checkpoints) are unchanged
    # A decoder's pairs run as one row each, their shared prompt computed once; encoders (and regression
    # rows, which have no partner) in length-planned chunks of padded rows.
    if uses_last_token_pooling(reader) and cfg.policy.reward_model_cfg.reward_model_type == "bradley_terry":
        forward = SharedPromptRewards(forward, tokenizer.pad_token_id)
    else:
        forward = ChunkedRewards(forward)
    if cfg.policy.dtensor_cfg.enabled:  # FSDP2 under torchrun: shard the model in place (gradients summed)
        shard_reward_model(model, cfg.policy, info)
    else:  # DDP under torchrun (gradients summed over ranks) wraps the whole chunked reward computation
        forward = dist.wrap_data_parallel(forward, info)
    data = load_run_data(cfg, tokenizer, out_dir)
    sampler = make_sampler(cfg, data.lengths, cfg.rm.seed)

    # --- optimizer, schedule, state
    optimizer = build_optimizer(model, cfg.policy.optimizer)
    steps = total_steps(cfg.rm, len(sampler))
    scheduler = build_scheduler(optimizer, cfg.policy.scheduler, steps)
    state = TrainState(model, optimizer, scheduler, sampler)
    step_fn = STEPS[cfg.policy.reward_model_cfg.reward_model_type]
    pad_id = tokenizer.pad_token_id

    # --- resume: weights, optimizer, schedule, sampler position, RNG, step; the log rewound to match
    resume_from = resolve_resume(out_dir, cfg.checkpointing.resume)
    saved = restore_training_state(resume_from, state, device) if resume_from else {}
    logger = open_logger(cfg, log_dir, state.step if resume_from else None, state.step >= steps)
    if dist.is_main():
        if resume_from:
            print(f"rmkit: resuming from {resume_from} (step {state.step}, epoch {state.epoch + 1})", file=sys.stderr)
        print(f"rmkit: training {cfg.policy.model_name} ({sum(p.numel() for p in model.parameters() if p.requires_grad):,}"
          f" trainable parameters) for {steps} steps of {cfg.policy.train_global_batch_size} on {device}"
          f" with {torch.get_num_threads()} threads, {cfg.policy.precision}", file=sys.stderr)
    val_metrics, val_rewards = saved.get("val_metrics", {}), {}
    if cfg.rm.val_at_start and data.val and not resume_from:
        val_metrics, val_rewards = run_validation(cfg, scorer, data, logger, state.step)
        if dist.is_main():
            print(f"rmkit: step 0: {_summary(val_metrics)}", file=sys.stderr)

    # --- the loop
    if resume_from:
        restore_rng(saved)  # last thing before the first step: nothing at setup shifts the random streams
    bar = ProgressBar(steps, cfg.logger.progress_bar and dist.is_main(), initial=state.step)
    total, window = StepWindow(), StepWindow()
    window.__dict__.update(saved.get("log_window", {}))  # a resumed window logs the same means
    while state.step < steps and state.epoch < cfg.rm.max_num_epochs:
        sampler.set_epoch(state.epoch)
        for indices in sampler:
            t0 = time.perf_counter()
            batch = [data.train[i] for i in indices]
            metrics = step_fn(forward, batch, cfg.policy.train_micro_batch_size, pad_id, cfg.policy.precision, device)
            # The one host-device sync per step: the loss must be finite before the update is applied.
            loss, acc = torch.stack([metrics["loss"], metrics.get("acc", torch.full_like(metrics["loss"], math.nan))]).tolist()
            if not math.isfinite(loss):
                optimizer.zero_grad(set_to_none=True)
                raise TrainingDiverged(
                    f"the training loss became {loss} at step {state.step + 1} (epoch {state.epoch + 1}); the "
                    f"update was not applied. Lower policy.optimizer.lr (now {cfg.policy.optimizer.lr}), set "
                    f"policy.max_grad_norm, or check the data near this batch.")
            lr = scheduler.get_last_lr()[0]
            grad_norm = optimizer_step(model, optimizer, scheduler, cfg.policy.max_grad_norm)
            state.step += 1
            dt = time.perf_counter() - t0
            tokens = sum(item_tokens(item) for item in batch)
            for w in (total, window):
                w.add(dt, len(batch), tokens, loss, acc)
            bar.update(loss, acc, *window.rates())
            if state.step % cfg.rm.log_period == 0 or state.step == steps:
                logger.log({**window.metrics(), "train/grad_norm": float(grad_norm), "train/lr": lr}, state.step)
                window = StepWindow()
            last = state.step == steps
            if data.val and cfg.rm.val_period and state.step % cfg.rm.val_period == 0 and not last:
                val_metrics, val_rewards = run_validation(cfg, scorer, data, logger, state.step)
                bar.write(f"rmkit: step {state.step}: {_summary(val_metrics)}")
            ckpt = cfg.checkpointing
            if ckpt.enabled and ckpt.save_period and state.step % ckpt.save_period == 0 and not last:
                extra = {"val_metrics": val_metrics, "log_window": dict(vars(window))}
                save_training_checkpoint(cfg, state, val_metrics, extra, tokenizer)
            if last:
                break
        state.epoch += 1
    bar.close()
    if data.val and (cfg.rm.val_at_end or not val_rewards):
        val_metrics, val_rewards = run_validation(cfg, scorer, data, logger, state.step)
        if dist.is_main():
            print(f"rmkit: step {state.step}: {_summary(val_metrics)}", file=sys.stderr)
    if cfg.checkpointing.enabled:  # the last step, with the final validation as its metrics
        save_training_checkpoint(cfg, state, val_metrics, {"val_metrics": val_metrics}, tokenizer)
    logger.close()

    # --- export and plots (rank 0)
    final_dir = out_dir / "final"
    model = gather_full_model(model, lambda: load_model(cfg, torch.device("cpu"))[0])
    if dist.is_main():
        export_model(model, tokenizer, final_dir, cfg, reward_stats(val_rewards), scorer.contract)
    plots = []
    if cfg.logger.plots and dist.is_main():
        plots = [p for p in (plot_training_curves(logger.history, log_dir / "training_curves.png"),
                             plot_reward_histograms(val_rewards, log_dir / "reward_histograms.png")) if p]
    dist.destroy()
    return TrainResult(final_dir, log_dir, state.step, val_metrics, *total.rates(), plots)


def _summary(metrics: dict[str, float]) -> str:
    keys = [k for k in metrics if k.endswith(("/loss", "/acc"))]
    return ", ".join(f"{k} {metrics[k]:.4f}" for k in keys)
