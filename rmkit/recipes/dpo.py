"""The DPO recipe, top to bottom: config -> policy -> data -> reference log-probs -> optimizer -> loop -> export.

Direct Preference Optimization (https://arxiv.org/abs/2305.18290) of a causal LM on preference pairs, with
NeMo RL's `dpo.*` keys and metric names (`loss`, `sft_loss`, `preference_loss`, `accuracy`,
`rewards_chosen_mean`, `rewards_rejected_mean`, plus `rewards_margin_mean` and `num_valid_samples`; rewards are
the unscaled implicit rewards `log pi - log pi_ref` of a response). The reference policy's log-probs are
computed once, before the first step, and cached on disk (`rmkit.trainer.reference_logprobs`); each step then
runs the policy alone, over each pair as one row with its prompt computed once (`PairLogits`). One global batch
of pairs per optimizer step, split into micro-batches whose losses are divided by the global pair count (exact
gradient accumulation, `rmkit.trainer.accumulate`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from rmkit import distributed as dist
from rmkit.config import SamplingParams
from rmkit.data import load_preference_data
from rmkit.data.policy_tokenize import PolicyPair, tokenize_policy_pairs
from rmkit.errors import DataError
from rmkit.generation import generate_completions
from rmkit.losses.dpo import DPOLossFn
from rmkit.models.pair_logprobs import PLACEHOLDER, PairLogits, RefLogprobs, reference_tensor
from rmkit.models.policy import load_training_policy
from rmkit.recipes.configs import DPOTree
from rmkit.trainer.accumulate import accumulate, global_metrics, plan_micro_batches
from rmkit.trainer.export import export_policy
from rmkit.trainer.optim import build_optimizer, build_scheduler
from rmkit.trainer.plots import plot_training_curves
from rmkit.trainer.progress import ProgressBar, StepWindow
from rmkit.trainer.reference_logprobs import reference_logprobs, weights_digest
from rmkit.trainer.resume import restore_rng, save_training_checkpoint
from rmkit.trainer.run import Cadence, RunResult, apply_update, finish_run, resume, run_batches, start_run
from rmkit.trainer.run_data import DataSet, make_sampler, report_data, resolve_data_path
from rmkit.trainer.run_log import RunLogger, announce, append_samples, report_validation, summary
from rmkit.trainer.sharding import shard_policy
from rmkit.trainer.state import TrainState, total_steps

SHOWN = ("/loss", "/accuracy", "/rewards_margin_mean")  # the headline validation metrics printed during a run


def load_pairs(cfg: DPOTree, ds: DataSet, tokenizer) -> list[PolicyPair]:
    """A preference file through rmkit's data layer (formats, validation, `on_error`), as policy pairs."""
    data, max_length = ds.data, cfg.policy.max_total_sequence_length
    loaded = load_preference_data(
        resolve_data_path(ds.path), format=data.format, prompt_key=data.prompt_key, chosen_key=data.chosen_key,
        rejected_key=data.rejected_key, on_error=data.on_error, keep_ties=data.keep_ties,
        allow_empty_response=data.allow_empty_response, split=data.split)
    tokenized = tokenize_policy_pairs(loaded.records, tokenizer, max_length, overlong=data.overlong)
    report_data(ds, loaded, len(tokenized.pairs), "pair", tokenized.dropped,
                [f"{tokenized.truncated} truncated to {max_length} tokens"])
    if tokenized.emptied and dist.is_main():
        print(f"rmkit: warning: {ds.label}: {tokenized.emptied} of {len(tokenized.pairs)} prompts were cut to nothing "
              f"(what is left is what every prompt is rendered with: policy.max_total_sequence_length={max_length} "
              "leaves the responses all the room); raise policy.max_total_sequence_length, or set data.overlong=drop to "
              "leave out every pair that does not fit", file=sys.stderr)
    return tokenized.pairs



def _global_counts(pairs: Sequence[PolicyPair]) -> tuple[torch.Tensor, torch.Tensor]:
    """`(global_valid_seqs, global_valid_toks)` of a global batch whose local slice is `pairs`."""
    counts = torch.tensor([2.0 * len(pairs), float(sum(len(p.chosen_ids) + len(p.rejected_ids) for p in pairs))])
    seqs, toks = dist.all_reduce_sum(counts)
    return seqs, toks


def pair_loss(forward: torch.nn.Module, loss_fn, micro, global_seqs, global_toks) -> tuple[torch.Tensor, dict]:
    """The DPO loss of one micro-batch `[(pair, reference log-probs), ...]` (None: a placeholder pair that
    counts for nothing) through `forward` (`PairLogits`, or DDP around one)."""
    pairs, refs = zip(*micro) if micro is not None else ([PLACEHOLDER], [(torch.zeros(1), torch.zeros(1))])
    logits, data = forward(list(pairs))
    data["reference_policy_logprobs"] = reference_tensor(refs, pairs, data)
    if micro is None:
        data["sample_mask"] = torch.zeros_like(data["sample_mask"])
    return loss_fn(logits, data, global_seqs, global_toks)


def batch_metrics(micro_metrics: list[dict]) -> dict[str, torch.Tensor]:
    """The global batch's DPO metrics (each micro-batch's already divided by the global counts), with
    `rewards_margin_mean`."""
    out = global_metrics([{k: torch.as_tensor(v).cpu() for k, v in m.items()} for m in micro_metrics])
    out["rewards_margin_mean"] = out["rewards_chosen_mean"] - out["rewards_rejected_mean"]
    return out


def dpo_step(forward: torch.nn.Module, loss_fn, pairs: Sequence[PolicyPair], refs: Sequence[RefLogprobs],
             micro_size: int) -> dict[str, torch.Tensor]:
    """Forward and backward over this rank's `pairs` of one global batch (gradients accumulate in the
    model; the caller steps the optimizer). `forward` is a `PairLogits`, or DDP around one."""
    global_seqs, global_toks = _global_counts(pairs)
    micros = plan_micro_batches(list(zip(pairs, refs)), micro_size, forward)
    return batch_metrics(accumulate(forward, micros,
                                    lambda micro: pair_loss(forward, loss_fn, micro, global_seqs, global_toks)))


@torch.no_grad()
def validate_pairs(pair_logits: torch.nn.Module, loss_fn, pairs: Sequence[PolicyPair], refs: Sequence[RefLogprobs],
                   micro_size: int) -> dict[str, float]:
    """The DPO metrics over all of `pairs` (every rank scores its share), as floats."""
    mine = list(range(len(pairs)))[dist.rank()::dist.world_size()]
    local_pairs, local_refs = [pairs[i] for i in mine], [refs[i] for i in mine]
    global_seqs, global_toks = _global_counts(local_pairs)
    model = pair_logits.model
    was_training = model.training
    model.eval()
    micros = plan_micro_batches(list(zip(local_pairs, local_refs)), micro_size, pair_logits)
    metrics = [pair_loss(pair_logits, loss_fn, micro, global_seqs, global_toks)[1] for micro in micros]
    model.train(was_training)
    return {k: float(v) for k, v in batch_metrics(metrics).items()}


def run_validation(cfg: DPOTree, pair_logits: PairLogits, loss_fn, val: dict, tokenizer, logger: RunLogger,
                   step: int, log_dir: Path) -> dict[str, float]:
    """Validate on every set of `val` (`{name: (pairs, reference log-probs)}`, at most `dpo.val_batches` batches
    each), logged as `validation-<name>/<metric>`; then greedy answers to the first set's first prompts go
    to `samples.jsonl` (a sharded model generates on every rank: each forward all-gathers)."""
    metrics = {}
    for name, (pairs, refs) in val.items():
        values = validate_pairs(pair_logits, loss_fn, pairs, refs, cfg.dpo.val_micro_batch_size)
        metrics.update({f"validation-{name}/{k}": v for k, v in values.items()})
    logger.log(metrics, step)
    if cfg.dpo.num_sample_generations and val and (dist.is_main() or dist.is_sharded(pair_logits)):
        name, (pairs, _) = next(iter(val.items()))
        pairs = pairs[:cfg.dpo.num_sample_generations]
        if pairs:
            params = SamplingParams(cfg.dpo.sample_max_new_tokens, temperature=0.0)
            answers = generate_completions(pair_logits.model, tokenizer, [p.prompt_ids for p in pairs], params)
            append_samples(log_dir, step, [
                {"set": name, "source": p.source, "prompt": tokenizer.decode(p.prompt_ids), "completion": text}
                for p, text in zip(pairs, answers.text)])
    return metrics


def train(cfg: DPOTree) -> RunResult:
    """Train a policy with DPO as `cfg` says; the final policy goes to `<checkpoint_dir>/final/`."""
    run = start_run(cfg, cfg.dpo)  # threads, seed, torchrun, folders, the saved config

    # --- policy and data (tokenized once; the prompt rendered as at generation)
    model, tokenizer = load_training_policy(cfg.policy, run.device)
    weights = weights_digest(model)  # the reference's weights as loaded (before any sharding)
    pair_logits = PairLogits(model, tokenizer.pad_token_id, cfg.policy.precision)
    if cfg.policy.dtensor_cfg.enabled:  # FSDP2 under torchrun: shard the model in place (gradients summed)
        shard_policy(model, cfg.policy, run.info)
        forward = pair_logits
    else:  # DDP under torchrun: one forward per backward, gradients summed over ranks
        forward = dist.wrap_data_parallel(pair_logits, run.info)
    train_pairs = load_pairs(cfg, DataSet.of(cfg.data, None, run.out_dir), tokenizer)
    if not train_pairs:
        raise DataError(cfg.data.train_data_path, None, None, "no usable training records")
    val_pairs = {name: load_pairs(cfg, DataSet.of(cfg.data, name, run.out_dir), tokenizer)
                 for name in cfg.data.val_data_paths}

    # --- reference log-probs: one pass before training (the initial weights), or the cached one
    settings = {"precision": cfg.policy.precision, "max_total_sequence_length": cfg.policy.max_total_sequence_length,
                "overlong": cfg.data.overlong}
    cache_dir, micro = run.out_dir / "reference_logprobs", cfg.policy.train_micro_batch_size

    def reference(pairs: list[PolicyPair], label: str):
        return reference_logprobs(pair_logits, pairs, micro, cache_dir, label, weights, settings)

    train_refs = reference(train_pairs, "train")
    limit = cfg.dpo.val_batches * cfg.dpo.val_global_batch_size if cfg.dpo.val_batches else None
    val = {name: (pairs[:limit], reference(pairs[:limit], f"validation-{name}")) for name, pairs in val_pairs.items()}
    loss_fn = DPOLossFn(cfg.dpo.loss_config())

    # --- optimizer, schedule, state; resume (the logs rewound to match)
    sampler = make_sampler(cfg, [pair.length for pair in train_pairs], cfg.dpo.seed)
    optimizer = build_optimizer(model, cfg.policy.optimizer)
    steps = total_steps(cfg.dpo, len(sampler))
    scheduler = build_scheduler(optimizer, cfg.policy.scheduler, steps)
    state = TrainState(model, optimizer, scheduler, sampler)
    saved, logger = resume(run, state, steps)
    announce(f"DPO of {cfg.policy.model_name}", model, f"{steps} steps of {cfg.policy.train_global_batch_size} pairs",
             run.device, cfg.policy.precision)
    val_metrics = saved.get("val_metrics", {})
    validated = False
    if cfg.dpo.val_at_start and val and not run.resume_from:
        val_metrics, validated = run_validation(cfg, pair_logits, loss_fn, val, tokenizer, logger, 0, run.log_dir), True
        report_validation(0, val_metrics, SHOWN)

    # --- the loop
    if run.resume_from:
        restore_rng(saved)  # last thing before the first step: nothing at setup shifts the random streams
    bar = ProgressBar(steps, cfg.logger.progress_bar and dist.is_main(), initial=state.step)
    total, window = StepWindow(), StepWindow()
    window.__dict__.update(saved.get("log_window", {}))  # a resumed window logs the same means
    sums: dict[str, float] = dict(saved.get("log_sums", {}))
    when = Cadence.of(cfg, cfg.dpo, steps)
    for indices in run_batches(state, steps, cfg.dpo.max_num_epochs):
        t0 = time.perf_counter()
        batch, refs = [train_pairs[i] for i in indices], [train_refs[i] for i in indices]
        metrics = dpo_step(forward, loss_fn, batch, refs, cfg.policy.train_micro_batch_size)
        values = {k: float(v) for k, v in metrics.items()}  # the one host-device sync per step
        lr, grad_norm = apply_update(state, values["loss"], cfg.policy.max_grad_norm,
                                     f"Lower policy.optimizer.lr (now {cfg.policy.optimizer.lr}) or "
                                     "dpo.reference_policy_kl_penalty, or check the data near this batch.")
        state.step += 1
        dt = time.perf_counter() - t0
        tokens = sum(2 * len(p.prompt_ids) + len(p.chosen_ids) + len(p.rejected_ids) for p in batch)
        tokens = int(dist.all_reduce_sum(torch.tensor(tokens)))
        pairs = int(values["num_valid_samples"])
        for w in (total, window):
            w.add(dt, pairs, tokens, values["loss"], values["accuracy"])
        sums = {k: sums.get(k, 0.0) + v for k, v in values.items()}
        bar.update(values["loss"], values["accuracy"], *window.rates())
        if when.log(state.step):
            means = {f"train/{k}": v / window.steps for k, v in sums.items() if k != "num_valid_samples"}
            logger.log({**means, **_rates(window), "train/grad_norm": float(grad_norm), "train/lr": lr}, state.step)
            window, sums = StepWindow(), {}
        if val and when.validate(state.step):
            val_metrics = run_validation(cfg, pair_logits, loss_fn, val, tokenizer, logger, state.step, run.log_dir)
            validated = True
            bar.write(f"rmkit: step {state.step}: {summary(val_metrics, SHOWN)}")
        if when.save(state.step):
            extra = {"val_metrics": val_metrics, "log_window": dict(vars(window)), "log_sums": sums}
            save_training_checkpoint(cfg, state, val_metrics, extra, tokenizer)
    bar.close()
    if val and (cfg.dpo.val_at_end or not (validated or val_metrics)):
        val_metrics = run_validation(cfg, pair_logits, loss_fn, val, tokenizer, logger, state.step, run.log_dir)
        report_validation(state.step, val_metrics, SHOWN)

    # --- the last checkpoint, the export (rank 0) and plots
    final_dir = finish_run(run, state, logger, val_metrics, tokenizer,
                           export=lambda whole, folder: export_policy(whole, tokenizer, folder, cfg),
                           load_unsharded=lambda: load_training_policy(cfg.policy, torch.device("cpu"))[0])
    plots = []
    if cfg.logger.plots and dist.is_main():
        plots = [p for p in [plot_training_curves(logger.history, run.log_dir / "training_curves.png",
                                                  ("loss", "accuracy"))] if p]
    dist.destroy()
    pairs_per_s, tokens_per_s = total.rates()
    return RunResult(final_dir, run.log_dir, state.step, val_metrics, {"pairs/s": pairs_per_s, "tokens/s": tokens_per_s},
                     plots)


def _rates(window: StepWindow) -> dict[str, float]:
    pairs_per_s, tokens_per_s = window.rates()
    return {"train/pairs_per_s": pairs_per_s, "train/tokens_per_s": tokens_per_s}
