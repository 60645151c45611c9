"""A run's beginning and end, around the loop (`rmkit.trainer.loop.fit`):

    run = start_run(cfg, cfg.dpo)                 threads, seed, torchrun, folders, the saved config
    ...the recipe builds its model, data and `TrainState`...
    saved = resume(run, state, steps)             weights, optimizer, schedule, sampler, step; `run.logger`
                                                  opened, its logs (metrics.jsonl, samples.jsonl) rewound to match
    ...the steps...
    final_dir = finish_run(run, state, ...)       last checkpoint, the model gathered and exported
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rmkit import distributed as dist
from rmkit.config import save_config
from rmkit.errors import ConfigError
from rmkit.trainer.checkpointing.files import list_checkpoints
from rmkit.trainer.checkpointing.loop_state import (
    resolve_resume,
    restore_training_state,
    save_training_checkpoint,
)
from rmkit.trainer.datasets import check_data_paths
from rmkit.trainer.logging.run_logger import SAMPLES, open_logger
from rmkit.trainer.sharding import gather_full_model
from rmkit.trainer.state import TrainState, seed_everything, set_threads

# What a run writes into its log folder; a fresh run over an old folder moves these aside first.
LOG_FILES = ("metrics.jsonl", SAMPLES, "events.out.tfevents.*", "*.png")


@dataclass
class Run:
    """A started run: its config, processes, folders and the checkpoint it continues (None: fresh)."""

    cfg: Any
    info: dist.DistInfo
    out_dir: Path
    log_dir: Path
    resume_from: Path | None
    logger: Any = None  # opened by `resume`

    @property
    def device(self) -> torch.device:
        return self.info.device


@dataclass
class RunResult:
    """What a finished run produced. `rates`: training throughput over the steps' own time, e.g.
    `{"pairs/s": ..., "tokens/s": ...}` (validation, checkpoints and one-off passes excluded)."""

    final_dir: Path
    log_dir: Path
    steps: int
    val_metrics: dict[str, float] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)
    plots: list[Path] = field(default_factory=list)


def start_run(cfg, loop) -> Run:
    """Threads, seeds (`loop.seed`), the process group under torchrun, the output folders and the saved
    config. The output folder must be writable, and no other run may be using it (`hold_folder`). A fresh run over
    an old output folder first moves the old run's checkpoints, `final/` and logs aside (and says where), so
    nothing of the two runs mixes and no trained model is lost; a half-written `final/` is cleared."""
    check_data_paths(cfg.data)  # a wrong path fails before any model loads
    set_threads(cfg.policy.num_threads)
    seed_everything(loop.seed)
    info = dist.init_distributed()  # a no-op without torchrun; rank 0 alone writes and prints
    out_dir = Path(cfg.checkpointing.checkpoint_dir)
    log_dir = Path(cfg.logger.log_dir) if cfg.logger.log_dir else out_dir / "logs"
    if dist.is_main():
        hold_folder(out_dir, "checkpointing.checkpoint_dir")
        if cfg.logger.log_dir:
            hold_folder(log_dir, "logger.log_dir", lock=False)
    resume_from = resolve_resume(out_dir, cfg.checkpointing.resume)
    if dist.is_main():
        clear_partial_export(out_dir / "final")
        if resume_from is None:
            set_aside_earlier_run(out_dir, log_dir)
        save_config(cfg, out_dir / "config.yaml")
    dist.barrier()
    return Run(cfg, info, out_dir, log_dir, resume_from)


LOCK = ".rmkit-run.lock"  # in a run's checkpoint folder while a run holds it (`hold_folder`)
_held: dict[Path, Any] = {}  # the folders this process holds: a run that stopped keeps its lock until the process ends,
# and the next run into the same folder in this process (a resume after a stop) takes it over


def hold_folder(folder: Path, key: str, lock: bool = True) -> None:
    """Make sure a run can write `folder` (the config key `key` names it) and, with `lock`, that no other run is
    writing it: an exclusive lock on `<folder>/.rmkit-run.lock`, held until this process ends and naming its
    holder. A folder that cannot be written, or one another run holds, is a ConfigError naming the key."""
    blocker = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise ConfigError(key, f"cannot write to {folder}: {blocker} is a file, not a folder; give the run a folder "
                               f"it can write, e.g. {key}=results/my_run")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".rmkit-write-check-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(key, f"cannot write to {folder} ({err.strerror}); give the run a folder it can write, "
                          f"e.g. {key}=results/my_run") from None
    path = (folder / LOCK).resolve()
    if not lock or path in _held:
        return
    handle = path.open("a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ConfigError(key, f"{folder} is in use by another run ({holder}); wait for it to finish, or give this "
                          f"run another folder ({key}=...)") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    handle.flush()
    _held[path] = handle


def release_folder(folder: Path) -> None:
    """Let other runs into `folder` (a finished run's; `hold_folder`)."""
    handle = _held.pop((folder / LOCK).resolve(), None)
    if handle is not None:
        (folder / LOCK).unlink(missing_ok=True)
        handle.close()


def set_aside_earlier_run(out_dir: Path, log_dir: Path) -> Path | None:
    """Move an earlier run's checkpoints (`step_<N>`), its exported model (`final/`) and log files into
    `<out_dir>/replaced-<time>/`; return that folder, or None when there was nothing to move."""
    checkpoints = [path for _, path in list_checkpoints(out_dir)]
    final = [out_dir / "final"] if (out_dir / "final").is_dir() else []
    logs = sorted({p for pattern in LOG_FILES for p in log_dir.glob(pattern)}) if log_dir.is_dir() else []
    if not checkpoints and not final and not logs:
        return None
    stamp = time.strftime("replaced-%Y%m%d-%H%M%S", time.gmtime())
    aside, n = out_dir / stamp, 1
    while aside.exists():  # an earlier run replaced within the same second
        n += 1
        aside = out_dir / f"{stamp}-{n}"
    (aside / "logs").mkdir(parents=True)
    for path in checkpoints + final:
        path.rename(aside / path.name)
    for path in logs:
        path.rename(aside / "logs" / path.name)
    model = ", its final/ model" if final else ""
    print(f"rmkit: {out_dir} held an earlier run ({len(checkpoints)} checkpoint(s){model}, {len(logs)} log file(s)); "
          f"moved them to {aside} and starting fresh (to continue that run instead: move them back and pass "
          "--resume)", file=sys.stderr)
    return aside


def resume(run: Run, state: TrainState, steps: int) -> dict:
    """Load the checkpoint the run continues into `state` (weights, optimizer, schedule, sampler position,
    step, epoch) and open the run's logger as `run.logger`, its logs cut back to that step (`open_logger`; a run
    resumed at its last step validates again). Returns the saved trainer state, `{}` for a fresh run; call
    `restore_rng(saved)` just before the first step."""
    saved = restore_training_state(run.resume_from, state, run.device) if run.resume_from else {}
    if run.resume_from and dist.is_main():
        print(f"rmkit: resuming from {run.resume_from} (step {state.step}, epoch {state.epoch + 1})",
              file=sys.stderr)
    resumed_step = state.step if run.resume_from else None
    run.logger = open_logger(run.cfg, run.log_dir, resumed_step, state.step >= steps)
    return saved


def finish_run(run: Run, state: TrainState, val_metrics: dict, tokenizer,
               export: Callable[[torch.nn.Module, Path], Any], load_unsharded: Callable[[], torch.nn.Module],
               extra: dict | None = None) -> Path:
    """After the last step (and its validation): the last checkpoint (with `extra` loop state), the log
    closed, the model gathered on rank 0 when sharded and written by `export(model, folder)` into
    `<checkpoint_dir>/final/` atomically. Call on every rank; returns the `final/` path."""
    if run.cfg.checkpointing.enabled:
        save_training_checkpoint(run.cfg, state, val_metrics, {"val_metrics": val_metrics, **(extra or {})},
                                 tokenizer)
    run.logger.close()
    final_dir = run.out_dir / "final"
    model = gather_full_model(state.model, load_unsharded)
    if dist.is_main():
        export_atomically(final_dir, lambda folder: export(model, folder))
        release_folder(run.out_dir)
    return final_dir


def export_atomically(final_dir: Path, write: Callable[[Path], Any]) -> None:
    """`write(folder)` into `<final>.partial`, then swap it in for `final_dir`: a run killed while
    exporting leaves the previous `final/` (or none), never one without weights."""
    partial, replaced = _partial(final_dir), final_dir.with_name(final_dir.name + ".replaced")
    shutil.rmtree(partial, ignore_errors=True)
    write(partial)
    if final_dir.exists():
        final_dir.rename(replaced)
    partial.rename(final_dir)
    shutil.rmtree(replaced, ignore_errors=True)


def clear_partial_export(final_dir: Path) -> None:
    """Undo what a kill during `export_atomically` left: the unfinished folder goes, and a `final/`
    moved aside just before the swap comes back."""
    shutil.rmtree(_partial(final_dir), ignore_errors=True)
    replaced = final_dir.with_name(final_dir.name + ".replaced")
    if replaced.exists():
        if final_dir.exists():
            shutil.rmtree(replaced)
        else:
            replaced.rename(final_dir)


def _partial(final_dir: Path) -> Path:
    return final_dir.with_name(final_dir.name + ".partial")
