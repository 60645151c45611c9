"""The one training loop every recipe runs: `fit(run, state, steps, loop, parts)`.

A recipe builds its model, data and `TrainState`, then hands `fit` what is its own (`RecipeParts`): the step
(`indices -> StepReport`, forward, backward and update), the validation (`step -> metrics`), the export and the
plots. `fit` owns the rest, the same for every recipe:

    resume            weights, optimizer, schedule, sampler, step, the recipe's loop state; logs rewound
    validate          at the start (a fresh run, `val_at_start`), every `val_period` steps, and at the end
                      (`val_at_end`, or when this process has not validated yet)
    the steps         the sampler's global batches; `train/` metrics logged every `log_period` steps as their
                      means over the steps since the last line, with items/s and tokens/s
    save              a checkpoint every `checkpointing.save_period` steps, with the recipe's loop state
    finish            the last checkpoint, the model gathered and exported to `final/`, the plots, the result

Divergence: a step applies its update through `apply_update`, which stops the run (`TrainingDiverged`) before
a non-finite loss changes the weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rmkit import distributed as dist
from rmkit.errors import TrainingDiverged
from rmkit.trainer.checkpointing.loop_state import restore_rng, save_training_checkpoint
from rmkit.trainer.datasets import make_sampler
from rmkit.trainer.lifecycle import Run, RunResult, finish_run, resume
from rmkit.trainer.logging.progress import ProgressBar, StepWindow
from rmkit.trainer.logging.run_logger import announce, summary
from rmkit.trainer.optim import build_optimizer, build_scheduler, learning_rate, optimizer_step
from rmkit.trainer.state import TrainState, total_steps


@dataclass
class StepReport:
    """What one step of a recipe reports to the loop.

    `metrics`: logged names and values (`train/loss`, `timing/train/...`), floats or 0-dim tensors (read on the
    host only when a line is logged); `items` and `tokens`: what the step trained on, over all ranks, for the
    rates (0: the recipe reports no rates); `shown`: the progress bar's numbers."""

    metrics: dict[str, Any]
    items: int = 0
    tokens: int = 0
    shown: dict[str, float] = field(default_factory=dict)


@dataclass
class RecipeParts:
    """What a recipe gives `fit`.

    - `action`, `length`: the announcement, "<action> (N trainable parameters) for <length> on <device>".
    - `step(indices)`: one step over the global batch `indices` (this rank's share of it is the recipe's business),
      its update applied (`apply_update`, or `supervised_report` for a supervised recipe); returns a `StepReport`.
    - `validate(step)`: the validation metrics, logged by the recipe (`run.logger`); None: nothing to validate on.
    - `shown`: the endings of the validation metrics printed after each validation (empty: the recipe prints).
    - `tokenizer`: saved with every checkpoint, so a step folder works as a model folder.
    - `export(model, folder)`, `load_unsharded()`: `finish_run`'s.
    - `plots(history, log_dir)`: the figures written at the end (rank 0, with `logger.plots`).
    - `loop_state()`, `restore(saved)`: what the recipe keeps in checkpoints besides the weights, and how a
      resumed run takes it back (called before the first validation).
    - `items`: what `StepReport.items` counts ("pairs", "sequences"), naming the rates.
    """

    action: str
    length: str
    step: Callable[[list[int]], StepReport]
    validate: Callable[[int], dict[str, float]] | None
    tokenizer: Any
    export: Callable[[torch.nn.Module, Path], Any]
    load_unsharded: Callable[[], torch.nn.Module]
    plots: Callable[[list[dict], Path], list[Path | None]] = lambda history, log_dir: []
    shown: tuple[str, ...] = ()
    loop_state: Callable[[], dict] = dict
    restore: Callable[[dict], None] = lambda saved: None
    items: str = "pairs"


def start_state(model: torch.nn.Module, policy, sampler, steps: int) -> TrainState:
    """A `TrainState` with `policy.optimizer`'s AdamW over `model` and `policy.scheduler`'s schedule over `steps`
    optimizer steps."""
    optimizer = build_optimizer(model, policy.optimizer)
    return TrainState(model, optimizer, build_scheduler(optimizer, policy.scheduler, steps), sampler)


def sampled_state(cfg, loop, model: torch.nn.Module, lengths: list[int],
                  sequences: list[list[int]] | None = None) -> tuple[TrainState, int]:
    """`(state, steps)` of a recipe that samples global batches of its items (`lengths`: each item's, for
    `data.batching: length_grouped`; `sequences`: their token ids, for `prefix_grouped`): the sampler
    (`make_sampler`, seeded from `loop.seed`), the run's optimizer steps (`total_steps`) and `start_state`'s
    optimizer and schedule over them."""
    sampler = make_sampler(cfg, lengths, loop.seed, sequences)
    steps = total_steps(loop, len(sampler))
    return start_state(model, cfg.policy, sampler, steps), steps


def fit(run: Run, state: TrainState, steps: int, loop, parts: RecipeParts) -> RunResult:
    """Run `steps` steps of `parts.step` from where `state` stands, as the module docstring says; `loop`: the
    recipe's loop section (`rm`, `sft`, `dpo`, `grpo`, `ppo`). Call on every rank; returns the run's result."""
    saved = resume(run, state, steps)
    if run.resume_from:
        parts.restore(saved)
    announce(parts.action, state.model, parts.length, run.device, run.cfg.policy.precision)
    bar = ProgressBar(steps, run.cfg.logger.progress_bar and dist.is_main(), initial=state.step)
    val_metrics, validated = saved.get("val_metrics", {}), False

    def validate() -> dict[str, float]:
        metrics = parts.validate(state.step)
        if parts.shown:
            bar.write(f"rmkit: step {state.step}: {summary(metrics, parts.shown)}")
        return metrics

    if parts.validate is not None and loop.val_at_start and not run.resume_from:
        val_metrics, validated = validate(), True
    if run.resume_from:
        restore_rng(saved)  # last thing before the first step: nothing at setup shifts the random streams
    total, window = StepWindow(), StepWindow.restored(saved.get("log_window"))
    when = Cadence.of(run.cfg, loop, steps)
    for indices in run_batches(state, steps, loop.max_num_epochs):
        t0 = time.perf_counter()
        report = parts.step(indices)
        seconds = time.perf_counter() - t0
        state.step += 1
        total.add(seconds, report.items, report.tokens, {})
        window.add(seconds, report.items, report.tokens, report.metrics)
        bar.advance(**report.shown, **(_rates(window, parts.items + "_s", "tok_s") if report.items else {}))
        if when.log(state.step):
            rates = _rates(window, f"train/{parts.items}_per_s", "train/tokens_per_s") if report.items else {}
            run.logger.log({**window.means(), **rates}, state.step)
            window = StepWindow()
        if parts.validate is not None and when.validate(state.step):
            val_metrics, validated = validate(), True
        if when.save(state.step):
            extra = {"val_metrics": val_metrics, "log_window": window.state(), **parts.loop_state()}
            save_training_checkpoint(run.cfg, state, val_metrics, extra, parts.tokenizer)
    bar.close()
    if parts.validate is not None and (loop.val_at_end or not validated):
        val_metrics = validate()

    final_dir = finish_run(run, state, val_metrics, parts.tokenizer, export=parts.export,
                           load_unsharded=parts.load_unsharded,
                           extra={"log_window": window.state(), **parts.loop_state()})
    plots = []
    if run.cfg.logger.plots and dist.is_main():
        plots = [p for p in parts.plots(run.logger.history, run.log_dir) if p]
    dist.destroy()
    rates = _rates(total, f"{parts.items}/s", "tokens/s") if total.items else {}
    return RunResult(final_dir, run.log_dir, state.step, val_metrics, rates, plots)


def _rates(window: StepWindow, items_name: str, tokens_name: str) -> dict[str, float]:
    items_per_s, tokens_per_s = window.rates()
    return {items_name: items_per_s, tokens_name: tokens_per_s}


@dataclass
class Cadence:
    """When a step logs, validates and saves: `log_period`, `val_period` and `checkpointing.save_period`
    of the run's config; the last step always logs, and its validation and checkpoint happen at the end
    (`finish_run`)."""

    steps: int
    log_period: int
    val_period: int
    save_period: int

    @classmethod
    def of(cls, cfg, loop, steps: int) -> Cadence:
        ckpt = cfg.checkpointing
        return cls(steps, loop.log_period, loop.val_period, ckpt.save_period if ckpt.enabled else 0)

    def log(self, step: int) -> bool:
        return step % self.log_period == 0 or step == self.steps

    def validate(self, step: int) -> bool:
        return bool(self.val_period) and step % self.val_period == 0 and step != self.steps

    def save(self, step: int) -> bool:
        return bool(self.save_period) and step % self.save_period == 0 and step != self.steps


def run_batches(state: TrainState, steps: int, max_epochs: int) -> Iterator:
    """The global batches (the sampler's index lists) from where `state` stands, epoch after epoch,
    until `steps` optimizer steps; the caller advances `state.step` once per batch."""
    while state.step < steps and state.epoch < max_epochs:
        state.sampler.set_epoch(state.epoch)
        for indices in state.sampler:
            yield indices
            if state.step >= steps:
                break
        state.epoch += 1


def apply_update(state: TrainState, loss: float, max_grad_norm: float | None, hint: str) -> tuple[float, torch.Tensor]:
    """The optimizer step of the gradients in `.grad`, once `loss` (the step's, read on the host) is known to be
    finite (`check_finite`, with `hint` for the message): clipping to `max_grad_norm`, the step, the schedule.
    Returns the learning rate the step used and the gradient norm before clipping."""
    check_finite(loss, state, hint)
    lr = learning_rate(state.optimizer, "policy")
    return lr, optimizer_step(state.model, state.optimizer, state.scheduler, max_grad_norm)


def supervised_report(state: TrainState, policy, metrics: dict[str, torch.Tensor], items: int, tokens: int,
                      shown: dict[str, str], hint: str | None = None) -> StepReport:
    """A supervised recipe's step after its forward and backward: the global batch's metrics (0-dim tensors, `loss`
    among them) read on the host in one sync, the update (`apply_update`, `policy.max_grad_norm`; `hint` for a
    diverged loss, by default the learning rate's), then its report: the metrics as `train/<name>` with
    `train/grad_norm` (a tensor, read when logged) and `train/lr`, `items` and `tokens` (this rank's share) summed
    over ranks, and `shown` (bar name -> metric name) for the progress bar."""
    hint = hint or (f"Lower policy.optimizer.lr (now {policy.optimizer.lr}), set policy.max_grad_norm, or check the "
                    "data near this batch.")
    names = list(metrics)
    values = dict(zip(names, torch.stack([metrics[k].float() for k in names]).tolist()))
    lr, grad_norm = apply_update(state, values["loss"], policy.max_grad_norm, hint)
    logged = {**{f"train/{k}": v for k, v in values.items()}, "train/grad_norm": grad_norm, "train/lr": lr}
    counts = dist.all_reduce_sum(torch.tensor([float(items), float(tokens)])).tolist()
    bar = {name: logged[f"train/{metric}"] for name, metric in shown.items() if f"train/{metric}" in logged}
    return StepReport(logged, int(counts[0]), int(counts[1]), bar)


def supervised_step(state: TrainState, policy, items: Sequence, forward_backward: Callable[[list], dict],
                    tokens: Callable[[Any], int], shown: dict[str, str]) -> Callable[[list[int]], StepReport]:
    """`RecipeParts.step` of a recipe that trains on `items`: the global batch's items (this rank's indices), the
    recipe's `forward_backward(batch) -> metrics` (0-dim tensors, `loss` among them), then `supervised_report`
    (`tokens(item)`: the real tokens an item feeds the model)."""
    def step(indices: list[int]) -> StepReport:
        batch = [items[i] for i in indices]
        metrics = forward_backward(batch)
        return supervised_report(state, policy, metrics, len(batch), sum(tokens(item) for item in batch), shown)

    return step


def check_finite(loss: float, state: TrainState, hint: str) -> None:
    """Stop the run when the loss of the step about to be applied is NaN or infinite: its gradients are
    dropped, the last checkpoint stays the last good state, and `TrainingDiverged` names the step."""
    if math.isfinite(loss):
        return
    state.optimizer.zero_grad(set_to_none=True)
    raise TrainingDiverged(f"the training loss became {loss} at step {state.step + 1} (epoch {state.epoch + 1}); "
                           f"the update was not applied. {hint}")
