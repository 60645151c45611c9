"""Training checkpoints: self-describing `step_<N>/` directories, written atomically, verified on load.

Layout of `<checkpoint_dir>/step_<N>/`:

    model.safetensors    the model's parameters and buffers (shared tensors stored once)
    config.json          the transformers config of a plain transformers model (not of a LoRA-wrapped one)
    tokenizer files      when a tokenizer is given: with config.json, the directory loads with
                         `from_pretrained` and works with `rmkit eval / score / serve --model step_<N>`
    optimizer.pt         optimizer.state_dict()
    scheduler.pt         scheduler.state_dict()
    trainer_state.pt     step, epoch, sampler state, per-rank RNG states, loop extras
    config.yaml          the resolved rmkit config of the run
    metrics.json         the metrics logged at this step (validation included); top-k reads it
    manifest.json        format, step, layout, world size, and the sha256 and size of every file above;
                         written last

That is the "full" layout. A model sharded by FSDP2 writes the "sharded" layout instead
(`rmkit.trainer.checkpointing.sharded`): model.safetensors, optimizer.pt, config.json and the tokenizer give
way to torch.distributed.checkpoint's `.metadata` and one `__<rank>_0.distcp` per rank; the rest is the
same, written by the same functions (`start_checkpoint`, then `finish_checkpoint`).

A checkpoint is built in a hidden temporary directory beside its final place, every file and the
directory are fsynced, and only then is it renamed to `step_<N>` (a rename within one directory is
atomic). A crash at any moment leaves either the complete new checkpoint or none, and the previous
ones untouched. `latest_valid_checkpoint` re-hashes every file against the manifest, so a checkpoint
damaged later (a truncated copy, a full disk) is reported and skipped in favour of the one before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import yaml
from safetensors.torch import load_model, save_model

from rmkit.config import to_plain
from rmkit.wrappers import unwrap_model

FORMAT = "rmkit-checkpoint"
VERSION = 1
STEP_DIR = re.compile(r"^step_(\d+)$")
TMP_PREFIX = ".tmp-step_"
MANIFEST = "manifest.json"


def _warn(message: str) -> None:
    print(f"rmkit: warning: {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------- RNG state
def capture_rng_state() -> dict:
    """This process's RNG states: python `random`, numpy's global generator, torch CPU, every CUDA device.

    Stored as plain lists and tensors so `torch.load(weights_only=True)` reads them back.
    """
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": _to_lists(random.getstate()),
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    """Put back the RNG states `capture_rng_state` returned (CUDA only when both sides have it)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _to_lists(value):
    return [_to_lists(v) for v in value] if isinstance(value, tuple | list) else value


# -------------------------------------------------------------------------------------- file helpers
def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _fsync_path(path: Path) -> None:
    # Directories are fsynced so the names of new entries are on disk, not only their contents.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def _config_to_dict(config) -> dict | None:
    if config is None:
        return None
    if dataclasses.is_dataclass(config):
        config = dataclasses.asdict(config)
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dataclass or a dict, got {type(config).__name__}")
    return to_plain(config)


def _json_safe(metrics: dict) -> dict:
    out = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor):
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            value = str(value)  # JSON has no NaN/inf; keep them readable rather than failing the save
        out[str(key)] = value
    return out


# -------------------------------------------------------------------------------------------- saving
def save_checkpoint(
    checkpoint_dir: str | Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler=None,
    trainer_state: dict | None = None,
    rng_states: list[dict] | None = None,
    config=None,
    metrics: dict | None = None,
    tokenizer=None,
) -> Path:
    """Write `<checkpoint_dir>/step_<step>/` atomically and return its path (call on rank 0 only).

    Args:
        model: the model (DDP / compile wrappers are unwrapped); saved with safetensors.
        optimizer, scheduler: anything with `state_dict()`.
        trainer_state: picklable loop state: `epoch`, `sampler` state, consumed pairs, ... (`step`
            is added). Plain Python values and tensors, so it loads with `weights_only=True`.
        rng_states: one `capture_rng_state()` per rank (rank order); None captures this process's.
        config: the resolved run config (dataclass or dict), saved as YAML.
        metrics: the metrics at this step; `keep_top_k` ranks checkpoints by one of them.
        tokenizer: saved with `save_pretrained` when given.
    """
    tmp = start_checkpoint(checkpoint_dir, step)
    try:
        _write_weights(tmp, model, optimizer)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return finish_checkpoint(tmp, step, scheduler=scheduler, trainer_state=trainer_state, rng_states=rng_states,
                             config=config, metrics=metrics, tokenizer=tokenizer)


def start_checkpoint(checkpoint_dir: str | Path, step: int) -> Path:
    """A new hidden temporary directory beside the future `step_<step>` (rank 0); the weights go into it,
    then `finish_checkpoint` completes it. Leftovers of a process killed mid-write are removed first."""
    parent = Path(checkpoint_dir)
    parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(parent)
    tmp = parent / f"{TMP_PREFIX}{step}-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()
    return tmp


def finish_checkpoint(tmp: Path, step: int, *, scheduler=None, trainer_state: dict | None = None,
                      rng_states: list[dict] | None = None, config=None, metrics: dict | None = None,
                      tokenizer=None, layout: str = "full", world_size: int = 1) -> Path:
    """Write the loop's files and the manifest into `tmp` (which already holds the weights), fsync, and
    rename it to `step_<step>` (rank 0). `layout` ("full": model.safetensors and optimizer.pt; "sharded":
    `rmkit.trainer.checkpointing.sharded`) and the `world_size` that wrote it go into the manifest.
    Arguments as in `save_checkpoint`; on any failure `tmp` is removed."""
    try:
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        _write_loop_state(tmp, step, scheduler, trainer_state, rng_states, config, metrics)
        _write_manifest(tmp, step, layout, world_size)
        _fsync_path(tmp)
        final = tmp.parent / f"step_{step}"
        _move_into_place(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _write_weights(tmp: Path, model: torch.nn.Module, optimizer) -> None:
    bare = unwrap_model(model)
    save_model(bare, str(tmp / "model.safetensors"))
    if _is_transformers_model(bare):  # not a peft model: its keys would not load into its base config
        bare.config.to_json_file(tmp / "config.json")
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")


def _write_loop_state(tmp, step, scheduler, trainer_state, rng_states, config, metrics) -> None:
    if scheduler is not None:
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    state = {**(trainer_state or {}), "step": step}
    state["rng"] = rng_states if rng_states is not None else [capture_rng_state()]
    torch.save(state, tmp / "trainer_state.pt")
    config_dict = _config_to_dict(config)
    if config_dict is not None:
        _write_text(tmp / "config.yaml", yaml.safe_dump(config_dict, sort_keys=False))
    _write_text(tmp / "metrics.json", json.dumps(_json_safe(metrics or {}), indent=1, sort_keys=True))


def _write_manifest(tmp: Path, step: int, layout: str, world_size: int) -> None:
    # Every file in `tmp`, other ranks' shards included (DCP fsyncs its own; fsyncing again is cheap).
    files = {}
    for path in sorted(p for p in tmp.iterdir() if p.is_file()):
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
        files[path.name] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "step": step,
        "layout": layout,
        "world_size": world_size,
        "created_unix": time.time(),
        "files": files,
    }
    with open(tmp / MANIFEST, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _is_transformers_model(model: torch.nn.Module) -> bool:
    transformers = sys.modules.get("transformers")  # never imported: cannot be one of its models
    return transformers is not None and isinstance(model, transformers.PreTrainedModel)


def _move_into_place(tmp: Path, final: Path) -> None:
    # rename() cannot replace a non-empty directory: an older step_<N> (a run resumed from an
    # earlier step writes the same step again) is first moved aside, then deleted.
    old = None
    if final.exists():
        old = final.with_name(f"{TMP_PREFIX}old-{final.name}-{os.getpid()}-{time.monotonic_ns()}")
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_path(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _remove_stale_temporaries(parent: Path) -> None:
    # Left behind by a process killed mid-write; only rank 0 writes, so none is in use now.
    for path in parent.glob(f"{TMP_PREFIX}*"):
        shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------------------------ listing, checks
def list_checkpoints(checkpoint_dir: str | Path) -> list[tuple[int, Path]]:
    """`(step, path)` of every `step_<N>` directory, oldest first (valid or not)."""
    parent = Path(checkpoint_dir)
    if not parent.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in parent.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(found)


def verify_checkpoint(path: str | Path) -> str | None:
    """None when `path` is complete and every file matches its manifest, else what is wrong."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "no manifest.json (the write did not finish)"
    except (OSError, ValueError) as err:
        return f"unreadable manifest.json ({err})"
    if manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        return "manifest.json is not an rmkit checkpoint manifest"
    for name, entry in manifest["files"].items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        size = file.stat().st_size
        if size != entry["bytes"]:
            return f"{name} has {size} bytes, the manifest says {entry['bytes']} (truncated or overwritten)"
        if sha256_file(file) != entry["sha256"]:
            return f"{name} does not match its sha256 in the manifest (corrupt)"
    return None


def latest_valid_checkpoint(checkpoint_dir: str | Path, warn: Callable[[str], None] = _warn) -> Path | None:
    """The newest `step_<N>` that passes `verify_checkpoint`, or None when there is none.

    Each newer checkpoint that fails is reported through `warn` with the reason, and the search
    falls back to the one before it.
    """
    for step, path in reversed(list_checkpoints(checkpoint_dir)):
        problem = verify_checkpoint(path)
        if problem is None:
            return path
        warn(f"checkpoint {path} (step {step}) is unusable: {problem}; falling back to an earlier one")
    return None


def read_metrics(path: str | Path) -> dict:
    """The metrics saved with a checkpoint (`{}` when absent or unreadable)."""
    try:
        return json.loads((Path(path) / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


# ------------------------------------------------------------------------------------------- loading
def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler=None,
    map_location: str | torch.device = "cpu",
    verify: bool = True,
) -> dict:
    """Restore `model` (and `optimizer`, `scheduler` when given) in place from a checkpoint directory.

    Returns the trainer state (`step`, `epoch`, `sampler`, `rng`: the per-rank RNG list, and whatever
    else the loop saved); the caller restores the sampler and calls `restore_rng_state(state["rng"][r])`
    last, just before the first step, so nothing in between consumes random numbers.

    Raises:
        ValueError: when `verify` and the checkpoint fails `verify_checkpoint`.
    """
    path = Path(path)
    if verify and (problem := verify_checkpoint(path)) is not None:
        raise ValueError(f"checkpoint {path} is unusable: {problem}")
    if (manifest := read_manifest(path))["layout"] != "full":
        raise ValueError(f"checkpoint {path} is {manifest['layout']} (written by {manifest['world_size']} "
                         "processes under FSDP2): load it with rmkit.trainer.checkpointing.sharded")
    bare = unwrap_model(model)
    missing, unexpected = load_model(
        bare, str(path / "model.safetensors"), strict=False, device=str(map_location)
    )
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {path} does not fit this model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    if optimizer is not None:
        optimizer.load_state_dict(
            torch.load(path / "optimizer.pt", map_location=map_location, weights_only=True)
        )
    return load_loop_state(path, scheduler)


def load_loop_state(path: Path, scheduler=None) -> dict:
    """Restore `scheduler` (when given) and return the trainer state of a checkpoint of either layout."""
    if scheduler is not None:
        scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    return torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=True)


def read_manifest(path: str | Path) -> dict:
    """A checkpoint's manifest.json; `layout` ("full" or "sharded") and `world_size` are filled in for
    checkpoints written before they were recorded (full, one writer)."""
    manifest = json.loads((Path(path) / MANIFEST).read_text(encoding="utf-8"))
    return {"layout": "full", "world_size": 1, **manifest}


# ------------------------------------------------------------------------------------------ retention
def prune_checkpoints(
    checkpoint_dir: str | Path,
    keep_top_k: int | None,
    metric_name: str | None = None,
    higher_is_better: bool = False,
) -> list[Path]:
    """Delete all but the `keep_top_k` best `step_<N>` checkpoints, always keeping the latest one.

    With `metric_name`, "best" ranks by that metric in each checkpoint's metrics.json (checkpoints
    without it, or with a NaN, rank last, newest first); without, the most recent ones are kept.
    `keep_top_k=None` keeps everything. Returns the deleted paths.
    """
    checkpoints = list_checkpoints(checkpoint_dir)
    if keep_top_k is None or len(checkpoints) <= keep_top_k:
        return []
    if keep_top_k < 1:
        raise ValueError(f"keep_top_k must be at least 1, got {keep_top_k}")
    latest_step = checkpoints[-1][0]

    def rank_key(item: tuple[int, Path]) -> tuple:
        step, path = item
        value = read_metrics(path).get(metric_name) if metric_name else None
        if not isinstance(value, int | float) or math.isnan(value):
            return (1, 0.0, -step)
        return (0, -value if higher_is_better else value, -step)

    ranked = sorted(checkpoints, key=rank_key) if metric_name else list(reversed(checkpoints))
    keep = {step for step, _ in ranked[:keep_top_k]} | {latest_step}
    deleted = []
    for step, path in checkpoints:
        if step not in keep:
            shutil.rmtree(path)
            deleted.append(path)
    return deleted
