"""Sharded checkpoints of an FSDP2 model: torch.distributed.checkpoint (DCP) shards in rmkit's step directories.

Every rank writes its own shards of the model and optimizer state (`get_state_dict`: FSDP2's DTensors as
they are, nothing gathered) into the temporary directory rank 0 opened; after a barrier rank 0 adds the
loop's files (scheduler, trainer state with every rank's RNG, config, metrics) and the manifest, and
renames the directory into place. Atomic writing, verification on resume and keep_top_k pruning are
`rmkit.trainer.checkpointing.files`'s, unchanged. The checkpoint directory must be on a file system every rank sees.

Loading reshards: DCP reads the saved shards into whatever this run's parameters are, so a checkpoint
written by N processes resumes under M, a single unsharded process included. A full checkpoint (written
by DDP or a single process) loads into a sharded model too: every rank reads the whole files and keeps
its shards.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from rmkit import distributed as dist
from rmkit.trainer.checkpointing.files import (
    finish_checkpoint,
    load_loop_state,
    read_manifest,
    start_checkpoint,
    verify_checkpoint,
)


def save_sharded_checkpoint(checkpoint_dir: str | Path, step: int, *, model: torch.nn.Module,
                            optimizer: torch.optim.Optimizer, **loop_files) -> Path | None:
    """Write `<checkpoint_dir>/step_<step>/` in the sharded layout; call on every rank. Returns its path on
    rank 0, None on the others. `loop_files`: `finish_checkpoint`'s keywords (scheduler, trainer_state,
    rng_states, config, metrics)."""
    tmp = dist.broadcast_object(str(start_checkpoint(checkpoint_dir, step)) if dist.is_main() else None)
    model_state, optim_state = get_state_dict(model, optimizer)
    _dcp(dcp.save, {"model": model_state, "optimizer": optim_state}, tmp)
    dist.barrier()  # every rank's shards are on disk before rank 0 hashes them and renames the directory
    if not dist.is_main():
        return None
    return finish_checkpoint(Path(tmp), step, layout="sharded", world_size=dist.world_size(), **loop_files)


def load_sharded_checkpoint(path: str | Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                            scheduler=None, verify: bool = True) -> dict:
    """Restore `model` and `optimizer` (sharded by FSDP2 or not) from a sharded checkpoint of any world
    size, or a sharded model from a full checkpoint; call on every rank. Returns the trainer state, as
    `rmkit.trainer.checkpointing.files.load_checkpoint` does.

    Raises:
        ValueError: when `verify` and the checkpoint fails `verify_checkpoint`.
    """
    path = Path(path)
    if verify and (problem := verify_checkpoint(path)) is not None:
        raise ValueError(f"checkpoint {path} is unusable: {problem}")
    if read_manifest(path)["layout"] == "sharded":
        _load_shards(path, model, optimizer)
    else:
        _load_full(path, model, optimizer)
    return load_loop_state(path, scheduler)


def _load_shards(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    # This run's state dicts say which slice each rank holds; DCP fills them in place from the saved shards.
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    _dcp(dcp.load, state, path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def _dcp(function, state: dict, path: str | Path) -> None:
    """`dcp.save` or `dcp.load` of `state` at `path`. A single process (a sharded checkpoint resumed
    unsharded) has no process group on purpose: DCP's warning about it is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        function(state, checkpoint_id=str(path))


def _load_full(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    saved = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
    set_state_dict(model, optimizer, model_state_dict=load_file(path / "model.safetensors"),
                   optim_state_dict=_by_name(saved, model, optimizer),
                   options=StateDictOptions(full_state_dict=True))


def _by_name(saved: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """`optimizer.state_dict()` numbers parameters in the optimizer's order; `set_state_dict` takes their
    names. The i-th parameter of the saved optimizer is the i-th of this one: `build_optimizer` built both
    from the same model, and sharding keeps parameter names and order."""
    names = {param: name for name, param in model.named_parameters()}
    order = [names[param] for group in optimizer.param_groups for param in group["params"]]
    return {
        "state": {order[i]: value for i, value in saved["state"].items()},
        "param_groups": [{**group, "params": [order[i] for i in group["params"]]} for group in saved["param_groups"]],
    }
