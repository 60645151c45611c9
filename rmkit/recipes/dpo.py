"""The DPO recipe, top to bottom: config -> policy -> data -> reference log-probs -> optimizer -> loop -> export.

Direct Preference Optimization (https://arxiv.org/abs/2305.18290) of a causal LM on preference pairs, with
NeMo RL's `dpo.*` keys and metric names. The reference policy's log-probs are computed once, before the
first step, and cached on disk (`rmkit.recipes.dpo_reference`); each step then runs the policy alone. One
global batch of pairs per optimizer step, split into micro-batches normalized by the global pair count (exact
gradient accumulation). Checkpoints, resume, logging and DDP are the trainer machinery the RM recipe uses.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rmkit import distributed as dist
from rmkit.config import save_config
from rmkit.data import load_preference_data, write_rejects
from rmkit.data.policy_tokenize import PolicyPair, tokenize_policy_pairs
from rmkit.errors import DataError
from rmkit.losses.dpo import DPOLossFn
from rmkit.models.policy import load_training_policy
from rmkit.recipes.dpo_config import DPOTree
from rmkit.recipes.dpo_logprobs import PairLogits
from rmkit.recipes.dpo_reference import reference_logprobs, weights_digest
from rmkit.recipes.dpo_step import dpo_step, rewind_samples, validate_pairs, write_samples
from rmkit.trainer.export import export_policy
from rmkit.trainer.optim import build_optimizer, build_scheduler, optimizer_step
from rmkit.trainer.plots import plot_training_curves
from rmkit.trainer.progress import ProgressBar, StepWindow
from rmkit.trainer.resume import resolve_resume, restore_rng, restore_training_state, save_training_checkpoint
from rmkit.trainer.run_data import make_sampler, resolve_data_path
from rmkit.trainer.run_log import RunLogger, open_logger
from rmkit.trainer.sharding import gather_full_model, shard_policy
from rmkit.trainer.state import TrainingDiverged, TrainState, seed_everything, set_threads, total_steps

SAMPLES = "samples.jsonl"


@dataclass
class DPOResult:
    """What a finished run produced."""

    final_dir: Path
    log_dir: Path
    steps: int
    val_metrics: dict[str, float] = field(default_factory=dict)
    pairs_per_s: float = 0.0
    tokens_per_s: float = 0.0
    plots: list[Path] = field(default_factory=list)



def load_pairs(cfg: DPOTree, path: str, tokenizer, rejects_path: Path, label: str) -> list[PolicyPair]:
    """A preference file through rmkit's data layer (formats, validation, `on_error`), as policy pairs."""
    data, max_length = cfg.data, cfg.policy.max_total_sequence_length
    loaded = load_preference_data(
        resolve_data_path(path), format=data.format, prompt_key=data.prompt_key, chosen_key=data.chosen_key,
        rejected_key=data.rejected_key, on_error=data.on_error, keep_ties=data.keep_ties,
        allow_empty_response=data.allow_empty_response, split=data.split)
    tokenized = tokenize_policy_pairs(loaded.records, tokenizer, max_length, overlong=data.overlong)
    skipped = list(loaded.skipped) + list(tokenized.dropped)
    if dist.is_main():
        if skipped:
            write_rejects(rejects_path, skipped)
        print(f"rmkit: {label}: {len(tokenized.pairs)} pairs from {path} ({tokenized.truncated} truncated to "
              f"{max_length} tokens" + (f", {len(skipped)} skipped -> {rejects_path}" if skipped else "") + ")",
              file=sys.stderr)
    return tokenized.pairs



def run_validation(cfg: DPOTree, pair_logits: PairLogits, loss_fn, val: dict, tokenizer, logger: RunLogger,
                   step: int, log_dir: Path) -> dict[str, float]:
    """Validate on every set of `val` (`{name: (pairs, reference log-probs)}`, at most `dpo.val_batches` batches
    each), logged as `validation-<name>/<metric>`; then write the sample generations (rank 0)."""
    metrics = {}
    for name, (pairs, refs) in val.items():
        values = validate_pairs(pair_logits, loss_fn, pairs, refs, cfg.dpo.val_micro_batch_size)
        metrics.update({f"validation-{name}/{k}": v for k, v in values.items()})
    logger.log(metrics, step)
    if cfg.dpo.num_sample_generations and val and (dist.is_main() or dist.is_sharded(pair_logits)):
        name, (pairs, _) = next(iter(val.items()))
        write_samples(pair_logits.model, tokenizer, pairs[:cfg.dpo.num_sample_generations], log_dir / SAMPLES,
                      step, name, cfg.dpo.sample_max_new_tokens)
    return metrics


def train(cfg: DPOTree) -> DPOResult:
    """Train a policy with DPO as `cfg` says; the final policy goes to `<checkpoint_dir>/final/`."""
    # --- setup: threads, seeds, output folders, the resolved config
    set_threads(cfg.policy.num_threads)
    seed_everything(cfg.dpo.seed)
    info = dist.init_distributed()  # a no-op without torchrun; rank 0 alone writes and prints
    out_dir = Path(cfg.checkpointing.checkpoint_dir)
    log_dir = Path(cfg.logger.log_dir) if cfg.logger.log_dir else out_dir / "logs"
    if dist.is_main():
        save_config(cfg, out_dir / "config.yaml")

    # --- policy and data (tokenized once; the prompt rendered as at generation)
    model, tokenizer = load_training_policy(cfg.policy, info.device)
    weights = weights_digest(model)  # the reference's weights as loaded (before any sharding)
    pair_logits = PairLogits(model, tokenizer.pad_token_id, cfg.policy.precision)
    if cfg.policy.dtensor_cfg.enabled:  # FSDP2 under torchrun: shard the model in place (gradients summed)
        shard_policy(model, cfg.policy, info)
        forward = pair_logits
    else:  # DDP under torchrun: one forward per backward, gradients summed over ranks
        forward = dist.wrap_data_parallel(pair_logits, info)
    train_pairs = load_pairs(cfg, cfg.data.train_data_path, tokenizer, out_dir / "rejects-train.jsonl", "train")
    if not train_pairs:
        raise DataError(cfg.data.train_data_path, None, None, "no usable training records")
    val_pairs = {name: load_pairs(cfg, path, tokenizer, out_dir / f"rejects-{name}.jsonl", f"validation-{name}")
                 for name, path in cfg.data.val_data_paths.items()}

    # --- reference log-probs: one pass before training (the initial weights), or the cached one
    settings = {"precision": cfg.policy.precision, "max_total_sequence_length": cfg.policy.max_total_sequence_length,
                "overlong": cfg.data.overlong}
    cache_dir, micro = out_dir / "reference_logprobs", cfg.policy.train_micro_batch_size

    def reference(pairs: list[PolicyPair], label: str):
        return reference_logprobs(pair_logits, pairs, micro, cache_dir, label, weights, settings)

    train_refs = reference(train_pairs, "train")
    limit = cfg.dpo.val_batches * cfg.dpo.val_global_batch_size if cfg.dpo.val_batches else None
    val = {name: (pairs[:limit], reference(pairs[:limit], f"validation-{name}")) for name, pairs in val_pairs.items()}
    loss_fn = DPOLossFn(cfg.dpo.loss_config())

    # --- optimizer, schedule, state
    sampler = make_sampler(cfg, [pair.length for pair in train_pairs], cfg.dpo.seed)
    optimizer = build_optimizer(model, cfg.policy.optimizer)
    steps = total_steps(cfg.dpo, len(sampler))
    scheduler = build_scheduler(optimizer, cfg.policy.scheduler, steps)
    state = TrainState(model, optimizer, scheduler, sampler)

    # --- resume: weights, optimizer, schedule, sampler position, RNG, step; the logs rewound to match
    resume_from = resolve_resume(out_dir, cfg.checkpointing.resume)
    saved = restore_training_state(resume_from, state, info.device) if resume_from else {}
    logger = open_logger(cfg, log_dir, state.step if resume_from else None, state.step >= steps)
    if dist.is_main():
        if resume_from:
            rewind_samples(log_dir / SAMPLES, state.step)
            print(f"rmkit: resuming from {resume_from} (step {state.step}, epoch {state.epoch + 1})", file=sys.stderr)
        print(f"rmkit: DPO of {cfg.policy.model_name} ({sum(p.numel() for p in model.parameters() if p.requires_grad):,}"
              f" trainable parameters) for {steps} steps of {cfg.policy.train_global_batch_size} pairs on "
              f"{info.device} with {torch.get_num_threads()} threads, {cfg.policy.precision}", file=sys.stderr)
    val_metrics = saved.get("val_metrics", {})
    validated = False
    if cfg.dpo.val_at_start and val and not resume_from:
        val_metrics, validated = run_validation(cfg, pair_logits, loss_fn, val, tokenizer, logger, 0, log_dir), True
        _report(0, val_metrics)

    # --- the loop
    if resume_from:
        restore_rng(saved)  # last thing before the first step: nothing at setup shifts the random streams
    bar = ProgressBar(steps, cfg.logger.progress_bar and dist.is_main(), initial=state.step)
    total, window = StepWindow(), StepWindow()
    window.__dict__.update(saved.get("log_window", {}))  # a resumed window logs the same means
    sums: dict[str, float] = dict(saved.get("log_sums", {}))
    while state.step < steps and state.epoch < cfg.dpo.max_num_epochs:
        sampler.set_epoch(state.epoch)
        for indices in sampler:
            t0 = time.perf_counter()
            batch, refs = [train_pairs[i] for i in indices], [train_refs[i] for i in indices]
            metrics = dpo_step(forward, loss_fn, batch, refs, cfg.policy.train_micro_batch_size)
            values = {k: float(v) for k, v in metrics.items()}  # the one host-device sync per step
            if not math.isfinite(values["loss"]):
                optimizer.zero_grad(set_to_none=True)
                raise TrainingDiverged(
                    f"the training loss became {values['loss']} at step {state.step + 1}; the update was not "
                    f"applied. Lower policy.optimizer.lr (now {cfg.policy.optimizer.lr}) or dpo.reference_policy_kl_penalty, "
                    f"or check the data near this batch.")
            lr = scheduler.get_last_lr()[0]
            grad_norm = optimizer_step(model, optimizer, scheduler, cfg.policy.max_grad_norm)
            state.step += 1
            dt = time.perf_counter() - t0
            tokens = sum(2 * len(p.prompt_ids) + len(p.chosen_ids) + len(p.rejected_ids) for p in batch)
            tokens = int(dist.all_reduce_sum(torch.tensor(tokens)))
            pairs = int(values["num_valid_samples"])
            for w in (total, window):
                w.add(dt, pairs, tokens, values["loss"], values["accuracy"])
            sums = {k: sums.get(k, 0.0) + v for k, v in values.items()}
            bar.update(values["loss"], values["accuracy"], *window.rates())
            last = state.step == steps
            if state.step % cfg.dpo.log_period == 0 or last:
                means = {f"train/{k}": v / window.steps for k, v in sums.items() if k != "num_valid_samples"}
                logger.log({**means, **_rates(window), "train/grad_norm": float(grad_norm), "train/lr": lr},
                           state.step)
                window, sums = StepWindow(), {}
            if val and cfg.dpo.val_period and state.step % cfg.dpo.val_period == 0 and not last:
                val_metrics = run_validation(cfg, pair_logits, loss_fn, val, tokenizer, logger, state.step, log_dir)
                validated = True
                bar.write(f"rmkit: step {state.step}: {_summary(val_metrics)}")
            ckpt = cfg.checkpointing
            if ckpt.enabled and ckpt.save_period and state.step % ckpt.save_period == 0 and not last:
                extra = {"val_metrics": val_metrics, "log_window": dict(vars(window)), "log_sums": sums}
                save_training_checkpoint(cfg, state, val_metrics, extra, tokenizer)
            if last:
                break
        state.epoch += 1
    bar.close()
    if val and (cfg.dpo.val_at_end or not (validated or val_metrics)):
        val_metrics = run_validation(cfg, pair_logits, loss_fn, val, tokenizer, logger, state.step, log_dir)
        _report(state.step, val_metrics)
    if cfg.checkpointing.enabled:  # the last step, with the latest validation as its metrics
        save_training_checkpoint(cfg, state, val_metrics, {"val_metrics": val_metrics}, tokenizer)
    logger.close()

    # --- export and plots (rank 0)
    final_dir = out_dir / "final"
    plots = []
    model = gather_full_model(model, lambda: load_training_policy(cfg.policy, torch.device("cpu"))[0])
    if dist.is_main():
        export_policy(model, tokenizer, final_dir, cfg)
        if cfg.logger.plots:
            plots = [p for p in [plot_training_curves(logger.history, log_dir / "training_curves.png",
                                                      ("loss", "accuracy"))] if p]
    dist.destroy()
    return DPOResult(final_dir, log_dir, state.step, val_metrics, *total.rates(), plots)


def _rates(window: StepWindow) -> dict[str, float]:
    pairs_per_s, tokens_per_s = window.rates()
    return {"train/pairs_per_s": pairs_per_s, "train/tokens_per_s": tokens_per_s}


def _report(step: int, metrics: dict[str, float]) -> None:
    if dist.is_main():
        print(f"rmkit: step {step}: {_summary(metrics)}", file=sys.stderr)


def _summary(metrics: dict[str, float]) -> str:
    keys = [k for k in metrics if k.endswith(("/loss", "/accuracy", "/rewards_margin_mean"))]
    return ", ".join(f"{k} {metrics[k]:.4f}" for k in keys)
