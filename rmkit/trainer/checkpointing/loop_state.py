"""What the training loop does with checkpoints: find the one to resume, restore it, save and prune.

The files themselves are `rmkit.trainer.checkpointing.files`'s business; this module knows the loop's pieces
(model, optimizer, scheduler, sampler, step, epoch, per-rank RNG, the metrics log) and the
`checkpointing` config. Every function is called on all ranks; only rank 0 touches the disk, except that
every rank writes its own shards of a sharded (FSDP2) checkpoint and reads the ones it needs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from rmkit import distributed as dist
from rmkit.errors import ConfigError
from rmkit.trainer.checkpointing.files import (
    capture_rng_state,
    latest_valid_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    read_manifest,
    restore_rng_state,
    save_checkpoint,
    verify_checkpoint,
)
from rmkit.trainer.checkpointing.sharded import load_sharded_checkpoint, save_sharded_checkpoint


def checkpoint_metrics(metrics: dict) -> dict:
    """`validation-<name>/<metric>` -> `val:validation-<name>_<metric>` (docs/design.md's checkpoint metric
    names, e.g. `val:validation-default_loss`); other keys are kept as they are."""
    out = {}
    for key, value in metrics.items():
        if key.startswith("validation-"):
            out["val:" + key.replace("/", "_")] = value
        else:
            out[key] = value
    return out


def resolve_resume(checkpoint_dir: str | Path, resume: str | None) -> Path | None:
    """The checkpoint to continue from: `resume` is None/"never" (start fresh), "auto" (the newest
    valid `step_<N>` in `checkpoint_dir`, or a fresh start when there is none) or a step directory.

    Rank 0 decides (it may warn about damaged checkpoints) and every rank gets its answer.
    """
    choice: str | None = None
    if dist.is_main():
        choice = _choose(Path(checkpoint_dir), resume)
    choice = dist.broadcast_object(choice)
    return Path(choice) if choice else None


def _choose(checkpoint_dir: Path, resume: str | None) -> str | None:
    if resume in (None, "never"):  # a fresh start (rmkit.trainer.lifecycle moves an earlier run's files aside)
        return None
    if resume == "auto":
        path = latest_valid_checkpoint(checkpoint_dir)
        if path is None:
            print(f"rmkit: no checkpoint to resume in {checkpoint_dir}; starting fresh", file=sys.stderr)
        return str(path) if path else None
    problem = verify_checkpoint(resume)
    if problem is not None:
        raise ConfigError("checkpointing.resume", f"{resume} is not a usable checkpoint: {problem}")
    return str(resume)


def restore_training_state(path: Path, state, device: torch.device) -> dict:
    """Load `path` into `state` (model, optimizer, scheduler, sampler, step, epoch). A sharded checkpoint
    loads into a model sharded over any number of processes or into an unsharded one; a sharded model loads
    either layout.

    Returns the whole saved trainer state (metrics, extras, `rng`); pass it to `restore_rng` just
    before the first step, after everything at setup that may draw random numbers.
    """
    if read_manifest(path)["layout"] == "sharded" or dist.is_sharded(state.model):  # DCP reshards
        saved = load_sharded_checkpoint(path, model=state.model, optimizer=state.optimizer, scheduler=state.scheduler)
    else:
        saved = load_checkpoint(
            path, model=state.model, optimizer=state.optimizer, scheduler=state.scheduler, map_location=device
        )
    try:
        state.sampler.load_state_dict(saved["sampler"])
    except ValueError as err:  # the data or the seed changed since the checkpoint
        raise ConfigError("checkpointing.resume", f"cannot continue {path}: {err}") from None
    state.step, state.epoch = saved["step"], saved["epoch"]
    return saved


def restore_rng(saved: dict) -> None:
    """This rank's RNG states from a loaded trainer state (rank 0's when the number of processes changed)."""
    rngs = saved["rng"]
    if len(rngs) != dist.world_size() and dist.is_main():
        print(
            f"rmkit: warning: the checkpoint was saved by {len(rngs)} process(es), this run has "
            f"{dist.world_size()}; random streams continue from rank 0's (the data order is unaffected)",
            file=sys.stderr,
        )
    restore_rng_state(rngs[dist.rank()] if len(rngs) == dist.world_size() else rngs[0])


def save_training_checkpoint(
    cfg, state, metrics: dict, extra: dict | None = None, tokenizer=None
) -> Path | None:
    """Save `step_<state.step>` with every rank's RNG state, then apply `keep_top_k` (call on every rank).
    A model sharded by FSDP2 is saved in the sharded layout, every rank writing its shards; otherwise
    rank 0 writes the full layout.

    Args:
        cfg: the run config (`cfg.checkpointing` is read; the whole tree is saved as config.yaml).
        state: the loop's TrainState.
        metrics: the latest metrics (validation included), saved under their checkpoint names.
        extra: more picklable loop state to keep (e.g. the last validation metrics).
        tokenizer: saved alongside (full layout), so the step directory works as a model directory.

    Returns the checkpoint's path on rank 0, None on the others.
    """
    rng_states = dist.all_gather_object(capture_rng_state())  # a collective: every rank calls it
    ckpt = cfg.checkpointing
    named = checkpoint_metrics(metrics)
    loop_files = {
        "scheduler": state.scheduler,
        "trainer_state": {"epoch": state.epoch, "sampler": state.sampler.state_dict(), **(extra or {})},
        "rng_states": rng_states,
        "config": cfg,
        "metrics": named,
    }
    path = None
    if dist.is_sharded(state.model):
        path = save_sharded_checkpoint(ckpt.checkpoint_dir, state.step, model=state.model,
                                       optimizer=state.optimizer, **loop_files)
    elif dist.is_main():
        path = save_checkpoint(ckpt.checkpoint_dir, state.step, model=state.model, optimizer=state.optimizer,
                               tokenizer=tokenizer, **loop_files)
    if dist.is_main():
        _check_metric_name(ckpt.metric_name, named)
        prune_checkpoints(ckpt.checkpoint_dir, ckpt.keep_top_k, ckpt.metric_name, ckpt.higher_is_better)
    dist.barrier()
    return path


_warned_metric_names: set[str] = set()


def _check_metric_name(metric_name: str | None, named: dict) -> None:
    # A misspelt metric name would silently turn top-k into "most recent k": say so, once per run.
    if not metric_name or not named or metric_name in named or metric_name in _warned_metric_names:
        return
    _warned_metric_names.add(metric_name)
    known = ", ".join(sorted(k for k in named if k.startswith("val:"))) or "none"
    print(
        f"rmkit: warning: checkpointing.metric_name '{metric_name}' is not among the validation metrics "
        f"({known}); checkpoints without it rank last, so keep_top_k keeps the most recent ones",
        file=sys.stderr,
    )
