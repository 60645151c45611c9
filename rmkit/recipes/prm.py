"""The process-reward-model recipe, top to bottom: config -> model -> data -> optimizer -> loop -> export.

A process reward model (PRM) scores every step of a solution: a sequence classifier with one output, read at the
last token of the separator after each step (`rmkit.data.step_tokenize`: TRL's PRMTrainer layout), gives the logit
of "this step is correct". A decoder gives every step's in one pass over the solution (`TokenValues`); an encoder
scores each step's prefix as a row of its own (`rmkit.models.step_values`: its output at a step has seen the whole
row, so the row ends at the step). The loss is the
binary cross-entropy with logits at the labelled steps, summed and divided by the global batch's labelled-step
count (docs/design.md's normalization), so gradient accumulation (`rmkit.trainer.accumulate`) and data parallelism
are exact. Validation every `prm.val_period` steps reports each set's loss and step accuracy (sigmoid > 0.5 agrees
with the label). The export is a plain sequence classifier with a scoring contract that names the separator, what
a step's score means and how the steps make one reward (`prm.aggregation`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from rmkit import distributed as dist
from rmkit.data.step_tokenize import StepIds, prefix_rows
from rmkit.errors import ConfigError
from rmkit.inference import contract_for
from rmkit.models.prefix_tree import tree_layout, tree_pays, tree_values
from rmkit.models.setup import (
    autocast,
    load_training_classifier,
)
from rmkit.models.step_values import scores_each_prefix, step_values
from rmkit.recipes.configs import PRMTree
from rmkit.trainer.accumulate import accumulate_batch, plan_micro_batches
from rmkit.trainer.datasets import load_sets, load_step_set
from rmkit.trainer.export import export_model
from rmkit.trainer.lifecycle import RunResult, start_run
from rmkit.trainer.logging.plots import plot_training_curves
from rmkit.trainer.loop import RecipeParts, fit, sampled_state, supervised_step
from rmkit.trainer.sharding import shard_reward_model
from rmkit.wrappers import transformers_model

SHOWN = ("/loss", "/step_acc")  # the headline validation metrics printed during a run
STEP_LABEL = "sigmoid of the head at the last token of the separator after a step: the probability the step is correct"


def load_model(cfg: PRMTree, device: torch.device):
    """`(model, tokenizer)`: the backbone as a one-output sequence classifier with the policy's options applied."""
    return load_training_classifier(cfg.policy, device, num_labels=1)


def collate(items: Sequence[StepIds], pad_token_id: int) -> dict[str, torch.Tensor]:
    """`input_ids`, `attention_mask` `[B, S]` (padded right), `step_mask` `[B, S]` (1 at each trained step's label
    position) and `labels` `[B, S]` (1.0 correct, 0.0 wrong; 0 where `step_mask` is 0)."""
    width = max(item.length for item in items)
    ids = torch.full((len(items), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(ids)
    step_mask, labels = torch.zeros(ids.shape), torch.zeros(ids.shape)
    for row, item in enumerate(items):
        ids[row, : item.length] = torch.tensor(item.input_ids)
        attention_mask[row, : item.length] = 1
        step_mask[row, list(item.positions)] = 1.0
        labels[row, list(item.positions)] = torch.tensor([float(label) for label in item.labels])
    return {"input_ids": ids, "attention_mask": attention_mask, "step_mask": step_mask, "labels": labels}


def step_losses(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The summed BCE-with-logits of the trained steps and how many of them the logits get right (sigmoid > 0.5,
    i.e. logit > 0, agrees with the label); `logits` `[B, S]` float32. Both 0-dim."""
    mask = batch["step_mask"]
    bce = F.binary_cross_entropy_with_logits(logits, batch["labels"], reduction="none")
    correct = ((logits > 0).float() == batch["labels"]).float()
    return (bce * mask).sum(), (correct * mask).sum()


def _placeholder(pad_token_id: int) -> list[StepIds]:
    """A micro-batch of one 2-token row with no trained step: it adds nothing to a loss or a count."""
    return [StepIds("placeholder", [pad_token_id] * 2, (), ())]


def _device_batch(micro, pad_token_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in collate(micro or _placeholder(pad_token_id), pad_token_id).items()}


@dataclass(frozen=True)
class PrefixSharing:
    """`prm.share_prefixes` where the forward runs: `decoder`, the transformers decoder inside the forward, computes
    what a micro-batch's solutions share once; `always` (`true`) sends every micro-batch through its prefix tree,
    else (`auto`) only those whose tree is estimated cheaper than their padded rows (`tree_pays`)."""

    decoder: torch.nn.Module
    always: bool


def prm_step(forward: torch.nn.Module, items: Sequence[StepIds], micro_size: int, pad_token_id: int,
             precision: str, device: torch.device, sharing: PrefixSharing | None = None) -> dict[str, torch.Tensor]:
    """Forward/backward of this rank's share `items` of a global batch (solutions, or an encoder's prefix rows)
    through `forward` (`rmkit.models.step_values`'s module, or DDP around it); returns the global batch's `loss`
    (mean BCE per labelled step) and `step_acc` as 0-dim device tensors; gradients are left in `.grad`. With
    `sharing` (`prm.share_prefixes`), the micro-batches take neighbours in token order and compute what their
    solutions share once (`rmkit.models.prefix_tree`)."""
    global_steps = dist.all_reduce_sum(torch.tensor(float(sum(len(i.positions) for i in items)), device=device))

    def run_micro(micro):
        batch = _device_batch(micro, pad_token_id, device)
        with autocast(precision, device):
            logits = _step_logits(forward, micro, batch, pad_token_id, sharing)
        bce, correct = step_losses(logits, batch)
        return bce / global_steps, {"loss": (bce / global_steps).detach(), "correct": correct.detach()}

    totals = accumulate_batch(forward, items, micro_size, _micro_order(sharing), run_micro, ["loss", "correct"])
    return {"loss": totals["loss"], "step_acc": totals["correct"] / global_steps}


def _step_logits(forward, micro, batch, pad_token_id: int, sharing: PrefixSharing | None) -> torch.Tensor:
    """The head's logit at every position of the micro-batch's rows, `[B, S]` float32: one padded forward, or as
    `sharing` says the rows' token trie, what they share computed once."""
    if sharing is not None:
        layout = tree_layout([i.input_ids for i in micro or _placeholder(pad_token_id)])
        if sharing.always or tree_pays(layout, sharing.decoder):
            return tree_values(forward, sharing.decoder, layout, pad_token_id).float()
    return forward(batch["input_ids"], batch["attention_mask"]).float()


def _micro_order(sharing: PrefixSharing | None) -> Callable[[StepIds], object]:
    """How a batch's solutions are sorted into micro-batches: by the ids themselves when sharing prefixes (solutions
    that begin alike fall in one micro-batch), else the longest first (each pads to its own longest)."""
    return (lambda i: i.input_ids) if sharing is not None else (lambda i: i.length)


@torch.no_grad()
def evaluate(forward: torch.nn.Module, items: Sequence[StepIds], micro_size: int, pad_token_id: int,
             precision: str, device: torch.device, sharing: PrefixSharing | None = None) -> dict[str, float]:
    """`loss` (mean BCE per labelled step), `step_acc` and `num_steps` of a validation set, each rank scoring its
    shard and the sums all-reduced; `sharing` as in `prm_step`."""
    was_training = forward.training
    forward.eval()
    sums = torch.zeros(3, device=device)  # bce, correct, labelled steps
    for micro in plan_micro_batches(dist.shard(items), micro_size, forward, _micro_order(sharing)):
        batch = _device_batch(micro, pad_token_id, device)
        with autocast(precision, device):
            logits = _step_logits(forward, micro, batch, pad_token_id, sharing)
        sums += torch.stack([*step_losses(logits, batch), batch["step_mask"].sum()])
    forward.train(was_training)
    bce, correct, steps = dist.all_reduce_sum(sums).tolist()
    return {"loss": bce / max(steps, 1), "step_acc": correct / max(steps, 1), "num_steps": steps}


def run_validation(cfg: PRMTree, forward, pad_token_id: int, val: dict[str, list], logger, step: int,
                   rows: Callable[[list], list] = list, sharing: PrefixSharing | None = None) -> dict:
    """Every set's `validation-<name>/{loss, step_acc, num_steps}`, logged; `rows` makes the solutions the rows the
    model reads (an encoder's: `prefix_rows`); `sharing` as in `prm_step`."""
    prm, device = cfg.prm, next(forward.parameters()).device
    limit = prm.val_batches * prm.val_global_batch_size if prm.val_batches else None
    metrics = {}
    for name, items in val.items():
        result = evaluate(forward, rows(items[:limit]), prm.val_micro_batch_size, pad_token_id, cfg.policy.precision,
                          device, sharing)
        metrics.update({f"validation-{name}/{k}": v for k, v in result.items()})
    logger.log(metrics, step)
    return metrics


def export_prm(model: torch.nn.Module, tokenizer, folder, cfg: PRMTree):
    """The classifier (`export_model`) with a scoring contract that says it scores steps."""
    contract = replace(contract_for(transformers_model(model), tokenizer, cfg.policy.max_total_sequence_length),
                       step_separator=cfg.prm.step_separator, step_label=STEP_LABEL,
                       step_aggregation=cfg.prm.aggregation)
    return export_model(model, tokenizer, folder, cfg, contract=contract)


def train(cfg: PRMTree) -> RunResult:
    """Train a process reward model as `cfg` says; the final model goes to `<checkpoint_dir>/final/`."""
    run = start_run(cfg, cfg.prm)  # threads, seed, torchrun, folders, the saved config
    device = run.device

    # --- model and data (tokenized once)
    model, tokenizer = load_model(cfg, device)
    encoder = scores_each_prefix(model)
    rows = prefix_rows if encoder else list  # an encoder: a row per step (rmkit.models.step_values)
    if cfg.prm.share_prefixes is True and encoder:
        raise ConfigError("prm.share_prefixes", f"{cfg.policy.model_name} is an encoder: it reads each step as a row "
                          "of its own, with nothing computed once; set prm.share_prefixes to auto or false (or train "
                          "a decoder)")
    if cfg.policy.dtensor_cfg.enabled:  # FSDP2 under torchrun: shard the model in place (gradients summed)
        shard_reward_model(model, cfg.policy, run.info)
        forward = step_values(model)
    else:  # DDP under torchrun: gradients summed over ranks
        forward = dist.wrap_data_parallel(step_values(model), run.info)
    train_items, val = load_sets(cfg.data, run.out_dir, lambda ds: load_step_set(cfg, ds, tokenizer), "solutions")

    # --- sampler, optimizer, schedule, state
    state, steps = sampled_state(cfg, cfg.prm, model, [item.length for item in train_items],
                                 [item.input_ids for item in train_items])
    sharing = (None if cfg.prm.share_prefixes is False or encoder
               else PrefixSharing(model, always=cfg.prm.share_prefixes is True))

    step = supervised_step(state, cfg.policy, train_items, lambda batch: prm_step(
        forward, rows(batch), cfg.policy.train_micro_batch_size, tokenizer.pad_token_id, cfg.policy.precision, device,
        sharing),
        tokens=lambda item: item.length, shown={"loss": "loss", "acc": "step_acc"})

    # --- the loop, the last checkpoint, the export (rank 0) and plots
    return fit(run, state, steps, cfg.prm, RecipeParts(
        action=f"training {cfg.policy.model_name} as a process reward model",
        length=f"{steps} steps of {cfg.policy.train_global_batch_size} solutions", step=step,
        validate=(lambda at: run_validation(cfg, forward, tokenizer.pad_token_id, val, run.logger, at, rows,
                                            sharing))
        if val else None,
        shown=SHOWN, tokenizer=tokenizer, items="solutions",
        export=lambda whole, folder: export_prm(whole, tokenizer, folder, cfg),
        load_unsharded=lambda: load_model(cfg, torch.device("cpu"))[0],
        plots=lambda history, log_dir: [plot_training_curves(history, log_dir / "training_curves.png",
                                                             ("loss", "step_acc"))]))
