"""The DPO recipe, top to bottom: config -> policy -> data -> optimizer -> reference log-probs -> loop -> export.

Direct Preference Optimization (https://arxiv.org/abs/2305.18290) of a causal LM on preference pairs, with
NeMo RL's `dpo.*` keys and metric names (`loss`, `sft_loss`, `preference_loss`, `accuracy`,
`rewards_chosen_mean`, `rewards_rejected_mean`, plus `rewards_margin_mean` and `num_valid_samples`; rewards are
the unscaled implicit rewards `log pi - log pi_ref` of a response). The reference policy's log-probs are
computed once, before the first step, for the training pairs the run's steps take (all of them unless
`dpo.max_num_steps` ends it first), and cached on disk (`rmkit.trainer.reference_logprobs`); each step then
runs the policy alone, over each pair as one row with its prompt computed once (`PairLogits`). One global batch
of pairs per optimizer step, split into micro-batches whose losses are divided by the global pair count (exact
gradient accumulation, `rmkit.trainer.accumulate`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from rmkit import distributed as dist
from rmkit.config import SamplingParams
from rmkit.data.policy_tokenize import PolicyPair
from rmkit.generation import generate_completions
from rmkit.losses.dpo import DPOLossFn
from rmkit.models.pair_logprobs import PLACEHOLDER, PairLogits, RefLogprobs, reference_tensor
from rmkit.models.policy import load_training_policy
from rmkit.recipes.configs import DPOTree
from rmkit.trainer.accumulate import accumulate, global_metrics, plan_micro_batches
from rmkit.trainer.datasets import load_policy_pairs, load_sets, sampled_items
from rmkit.trainer.export import export_policy
from rmkit.trainer.lifecycle import RunResult, start_run
from rmkit.trainer.logging.plots import plot_training_curves
from rmkit.trainer.logging.run_logger import RunLogger, append_samples
from rmkit.trainer.loop import RecipeParts, StepReport, fit, sampled_state, supervised_report
from rmkit.trainer.reference_logprobs import reference_logprobs, weights_digest
from rmkit.trainer.sharding import shard_policy

SHOWN = ("/loss", "/accuracy", "/rewards_margin_mean")  # the headline validation metrics printed during a run


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
    train_pairs, val_pairs = load_sets(cfg.data, run.out_dir, lambda ds: load_policy_pairs(cfg, ds, tokenizer), "records")

    # --- reference log-probs: one pass before training (the initial weights), or the cached one
    settings = {"precision": cfg.policy.precision, "max_total_sequence_length": cfg.policy.max_total_sequence_length,
                "overlong": cfg.data.overlong}
    cache_dir, micro = run.out_dir / "reference_logprobs", cfg.policy.train_micro_batch_size

    def reference(pairs: list[PolicyPair], label: str):
        return reference_logprobs(pair_logits, pairs, micro, cache_dir, label, weights, settings)

    # --- optimizer, schedule, state (before the reference pass: a short run needs the log-probs of its pairs only)
    state, steps = sampled_state(cfg, cfg.dpo, model, [pair.length for pair in train_pairs])

    used = sampled_items(state.sampler, steps)
    if len(used) < len(train_pairs) and dist.is_main():
        print(f"rmkit: dpo: reference log-probs of the {len(used)} of {len(train_pairs)} training pairs that the run's "
              f"{steps} steps take", file=sys.stderr)
    train_refs = dict(zip(used, reference([train_pairs[i] for i in used], "train")))
    limit = cfg.dpo.val_batches * cfg.dpo.val_global_batch_size if cfg.dpo.val_batches else None
    val = {name: (pairs[:limit], reference(pairs[:limit], f"validation-{name}")) for name, pairs in val_pairs.items()}
    loss_fn = DPOLossFn(cfg.dpo.loss_config())

    def step(indices: list[int]) -> StepReport:
        batch, refs = [train_pairs[i] for i in indices], [train_refs[i] for i in indices]
        metrics = dpo_step(forward, loss_fn, batch, refs, cfg.policy.train_micro_batch_size)
        metrics.pop("num_valid_samples")  # every pair of the batch: the report counts them
        tokens = sum(2 * len(p.prompt_ids) + len(p.chosen_ids) + len(p.rejected_ids) for p in batch)
        return supervised_report(state, cfg.policy, metrics, len(batch), tokens, {"loss": "loss", "acc": "accuracy"},
                                 f"Lower policy.optimizer.lr (now {cfg.policy.optimizer.lr}) or "
                                 "dpo.reference_policy_kl_penalty, or check the data near this batch.")

    # --- the loop, the last checkpoint, the export (rank 0) and plots
    return fit(run, state, steps, cfg.dpo, RecipeParts(
        action=f"DPO of {cfg.policy.model_name}", length=f"{steps} steps of {cfg.policy.train_global_batch_size} pairs",
        step=step, shown=SHOWN, tokenizer=tokenizer,
        validate=(lambda at: run_validation(cfg, pair_logits, loss_fn, val, tokenizer, run.logger, at, run.log_dir))
        if val else None,
        export=lambda whole, folder: export_policy(whole, tokenizer, folder, cfg),
        load_unsharded=lambda: load_training_policy(cfg.policy, torch.device("cpu"))[0],
        plots=lambda history, log_dir: [plot_training_curves(history, log_dir / "training_curves.png",
                                                             ("loss", "accuracy"))]))
