"""The supervised fine-tuning recipe, top to bottom: config -> model -> data -> optimizer -> loop -> export.

A policy (any causal LM) learns to say what demonstrations say: the NLL of their trained tokens (the
assistant turns by default), normalized by the global batch's trained-token count, so gradient accumulation
and data parallelism are exact. Validation every `sft.val_period` steps reports the loss, token accuracy and
tokens/s per set and writes greedy sample generations for held-out prompts to `<log_dir>/samples.jsonl`.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rmkit import distributed as dist
from rmkit.config import save_config
from rmkit.data import write_rejects
from rmkit.data.demonstrations import load_demonstrations, tokenize_demonstrations
from rmkit.errors import DataError
from rmkit.generation import SamplingParams, generate_completions
from rmkit.models.policy import load_training_policy
from rmkit.models.setup import autocast
from rmkit.recipes.sft_config import SFTTree
from rmkit.recipes.sft_step import evaluate, sft_step
from rmkit.trainer.export import export_policy
from rmkit.trainer.optim import build_optimizer, build_scheduler, optimizer_step
from rmkit.trainer.plots import plot_training_curves
from rmkit.trainer.progress import ProgressBar, StepWindow
from rmkit.trainer.resume import resolve_resume, restore_rng, restore_training_state, save_training_checkpoint
from rmkit.trainer.run_data import make_sampler, resolve_data_path
from rmkit.trainer.run_log import open_logger
from rmkit.trainer.sharding import gather_full_model, shard_policy
from rmkit.trainer.state import TrainingDiverged, TrainState, seed_everything, set_threads, total_steps


@dataclass
class SFTResult:
    """What a finished run produced."""

    final_dir: Path
    log_dir: Path
    steps: int
    val_metrics: dict[str, float] = field(default_factory=dict)
    sequences_per_s: float = 0.0
    tokens_per_s: float = 0.0
    plots: list[Path] = field(default_factory=list)



def load_demonstration_set(cfg: SFTTree, path: str, tokenizer, rejects: Path, label: str) -> list:
    """Demonstrations of `path`, validated and tokenized; skipped records go to `rejects` (rank 0 reports)."""
    data, sft = cfg.data, cfg.sft
    max_length = cfg.policy.max_total_sequence_length
    loaded = load_demonstrations(resolve_data_path(path), data.format, messages_key=data.messages_key,
                                 prompt_key=data.prompt_key, response_key=data.response_key, chosen_key=data.chosen_key,
                                 rejected_key=data.rejected_key, allow_empty_response=data.allow_empty_response,
                                 keep_ties=data.keep_ties, on_error=data.on_error, split=data.split)
    tokenized = tokenize_demonstrations(loaded.records, tokenizer, max_length, data.overlong, sft.assistant_only_loss,
                                        sft.only_unmask_final, data.on_error)
    skipped = list(loaded.skipped) + tokenized.dropped
    if dist.is_main():
        if skipped:
            write_rejects(rejects, skipped)
        print(f"rmkit: {label}: {len(tokenized.items)} demonstrations from {path} ({tokenized.truncated} truncated to "
              f"{max_length} tokens" + (f", {len(skipped)} skipped -> {rejects}" if skipped else "") + ")", file=sys.stderr)
    return tokenized.items


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
        write_samples(cfg, model, tokenizer, val, step, log_dir / "samples.jsonl")
    return metrics


def write_samples(cfg: SFTTree, model, tokenizer, val: dict[str, list], step: int, path: Path) -> None:
    """Greedy answers to the first `sft.num_sample_generations` prompts of each set, appended to `path` by rank 0
    (a sharded model generates on every rank: each forward all-gathers)."""
    params = SamplingParams(max_new_tokens=cfg.sft.sample_max_new_tokens, temperature=0.0)
    lines = []
    for name, items in val.items():
        held_out = items[:cfg.sft.num_sample_generations]
        if not held_out:
            continue
        with autocast(cfg.policy.precision, next(model.parameters()).device):
            answers = generate_completions(model, tokenizer, [d.input_ids[:d.prompt_length] for d in held_out], params)
        lines += [json.dumps({"step": step, "set": name, "source": d.source,
                              "prompt": tokenizer.decode(d.input_ids[:d.prompt_length]), "completion": completion,
                              "reference": tokenizer.decode(d.input_ids[d.prompt_length:], skip_special_tokens=True)},
                             ensure_ascii=False) + "\n" for d, completion in zip(held_out, answers.text)]
    if dist.is_main():
        with path.open("a", encoding="utf-8") as out:
            out.writelines(lines)


def rewind_samples(path: Path, step: int, revalidates: bool) -> None:
    """A resumed run keeps the samples up to its checkpoint's step (as `metrics.jsonl`)."""
    if not path.is_file():
        return
    kept = [line for line in path.read_text(encoding="utf-8").splitlines()
            if _sample_step(line) < step or (_sample_step(line) == step and not revalidates)]
    path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


def _sample_step(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError):  # a line cut short by a kill
        return math.inf



def train(cfg: SFTTree) -> SFTResult:
    """Fine-tune a policy on demonstrations as `cfg` says; the final model goes to `<checkpoint_dir>/final/`."""
    # --- setup: threads, seeds, output folders, the resolved config
    set_threads(cfg.policy.num_threads)
    seed_everything(cfg.sft.seed)
    info = dist.init_distributed()  # a no-op without torchrun; rank 0 alone writes and prints
    device = info.device
    out_dir = Path(cfg.checkpointing.checkpoint_dir)
    log_dir = Path(cfg.logger.log_dir) if cfg.logger.log_dir else out_dir / "logs"
    if dist.is_main():
        save_config(cfg, out_dir / "config.yaml")

    # --- model and data (tokenized once)
    model, tokenizer = load_training_policy(cfg.policy, device)
    if cfg.policy.dtensor_cfg.enabled:  # FSDP2 under torchrun: shard the model in place (gradients summed)
        shard_policy(model, cfg.policy, info)
        forward = model
    else:  # DDP under torchrun: gradients summed over ranks
        forward = dist.wrap_data_parallel(model, info)
    train_items = load_demonstration_set(cfg, cfg.data.train_data_path, tokenizer, out_dir / "rejects-train.jsonl", "train")
    if not train_items:
        raise DataError(cfg.data.train_data_path, None, None, "no usable training demonstrations")
    val = {name: load_demonstration_set(cfg, path, tokenizer, out_dir / f"rejects-{name}.jsonl", f"validation-{name}")
           for name, path in cfg.data.val_data_paths.items()}
    sampler = make_sampler(cfg, [d.length for d in train_items], cfg.sft.seed)

    # --- optimizer, schedule, state
    optimizer = build_optimizer(model, cfg.policy.optimizer)
    steps = total_steps(cfg.sft, len(sampler))
    scheduler = build_scheduler(optimizer, cfg.policy.scheduler, steps)
    state = TrainState(model, optimizer, scheduler, sampler)

    # --- resume: weights, optimizer, schedule, sampler position, RNG, step; the logs rewound to match
    resume_from = resolve_resume(out_dir, cfg.checkpointing.resume)
    saved = restore_training_state(resume_from, state, device) if resume_from else {}
    logger = open_logger(cfg, log_dir, state.step if resume_from else None, state.step >= steps)
    if resume_from and dist.is_main():
        rewind_samples(log_dir / "samples.jsonl", state.step, state.step >= steps)
        print(f"rmkit: resuming from {resume_from} (step {state.step}, epoch {state.epoch + 1})", file=sys.stderr)
    if dist.is_main():
        print(f"rmkit: fine-tuning {cfg.policy.model_name} ({sum(p.numel() for p in model.parameters() if p.requires_grad):,}"
              f" trainable parameters) for {steps} steps of {cfg.policy.train_global_batch_size} sequences on {device}"
              f" with {torch.get_num_threads()} threads, {cfg.policy.precision}", file=sys.stderr)
    val_metrics = saved.get("val_metrics", {})
    if cfg.sft.val_at_start and val and not resume_from:
        val_metrics = run_validation(cfg, model, tokenizer, val, logger, state.step, log_dir)
        if dist.is_main():
            print(f"rmkit: step 0: {_summary(val_metrics)}", file=sys.stderr)

    # --- the loop
    if resume_from:
        restore_rng(saved)  # last thing before the first step: nothing at setup shifts the random streams
    bar = ProgressBar(steps, cfg.logger.progress_bar and dist.is_main(), initial=state.step, items="seqs")
    total, window = StepWindow(), StepWindow()
    window.__dict__.update(saved.get("log_window", {}))  # a resumed window logs the same means
    while state.step < steps and state.epoch < cfg.sft.max_num_epochs:
        sampler.set_epoch(state.epoch)
        for indices in sampler:
            t0 = time.perf_counter()
            batch = [train_items[i] for i in indices]
            metrics = sft_step(forward, batch, cfg.policy.train_micro_batch_size, tokenizer.pad_token_id,
                               cfg.policy.precision, device, cfg.sft.sequence_packing)
            # The one host-device sync per step: the loss must be finite before the update is applied.
            loss, acc = torch.stack([metrics["loss"], metrics["token_acc"]]).tolist()
            if not math.isfinite(loss):
                optimizer.zero_grad(set_to_none=True)
                raise TrainingDiverged(
                    f"the training loss became {loss} at step {state.step + 1} (epoch {state.epoch + 1}); the update "
                    f"was not applied. Lower policy.optimizer.lr (now {cfg.policy.optimizer.lr}), set "
                    f"policy.max_grad_norm, or check the data near this batch.")
            lr = scheduler.get_last_lr()[0]
            grad_norm = optimizer_step(model, optimizer, scheduler, cfg.policy.max_grad_norm)
            state.step += 1
            dt = time.perf_counter() - t0
            tokens = dist.all_reduce_sum(torch.tensor(float(sum(d.length for d in batch)))).item()
            for w in (total, window):
                w.add(dt, len(batch) * dist.world_size(), int(tokens), loss, acc)
            bar.update(loss, acc, *window.rates())
            if state.step % cfg.sft.log_period == 0 or state.step == steps:
                logger.log({**_train_metrics(window), "train/grad_norm": float(grad_norm), "train/lr": lr}, state.step)
                window = StepWindow()
            last = state.step == steps
            if val and cfg.sft.val_period and state.step % cfg.sft.val_period == 0 and not last:
                val_metrics = run_validation(cfg, model, tokenizer, val, logger, state.step, log_dir)
                bar.write(f"rmkit: step {state.step}: {_summary(val_metrics)}")
            ckpt = cfg.checkpointing
            if ckpt.enabled and ckpt.save_period and state.step % ckpt.save_period == 0 and not last:
                extra = {"val_metrics": val_metrics, "log_window": dict(vars(window))}
                save_training_checkpoint(cfg, state, val_metrics, extra, tokenizer)
            if last:
                break
        state.epoch += 1
    bar.close()
    if val and (cfg.sft.val_at_end or not val_metrics):
        val_metrics = run_validation(cfg, model, tokenizer, val, logger, state.step, log_dir)
        if dist.is_main():
            print(f"rmkit: step {state.step}: {_summary(val_metrics)}", file=sys.stderr)
    if cfg.checkpointing.enabled:  # the last step, with the final validation as its metrics
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
                                                      ("loss", "token_acc"))] if p]
    dist.destroy()
    return SFTResult(final_dir, log_dir, state.step, val_metrics, *total.rates(), plots)


def _train_metrics(window: StepWindow) -> dict[str, float]:
    """The window's means under SFT's names: token accuracy, sequences/s."""
    names = {"train/acc": "train/token_acc", "train/pairs_per_s": "train/sequences_per_s"}
    return {names.get(k, k): v for k, v in window.metrics().items()}


def _summary(metrics: dict[str, float]) -> str:
    keys = [k for k in metrics if k.endswith(("/loss", "/token_acc"))]
    return ", ".join(f"{k} {metrics[k]:.4f}" for k in keys)
