"""torch.distributed for rmkit: set up from the torchrun environment, a few collectives, data sharding.

`torchrun --nproc-per-node N -m rmkit train ...` sets `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`
and `MASTER_PORT` in every process; `init_distributed()` reads them and joins the process group (gloo on
CPU, NCCL on GPU). Without them (a plain `rmkit train`) nothing is initialized and every function here
is a no-op that behaves as rank 0 of a world of 1, so the training loop calls them unconditionally.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rmkit.errors import ConfigError


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: global `rank` of `world_size`, `local_rank` on its node, its `device`."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(name, f"environment variable must be an integer, got {value!r}") from None


def init_distributed(backend: str | None = None, timeout_minutes: float = 30.0) -> DistInfo:
    """Join the process group described by the torchrun environment; a single process does nothing.

    Args:
        backend: "gloo" or "nccl"; None picks NCCL when CUDA is available, else gloo.
        timeout_minutes: how long a collective may wait for the other ranks before failing.
    """
    world = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if world <= 1:
        return DistInfo(0, 1, 0, torch.device("cuda", 0) if use_cuda else device)
    if use_cuda and local_rank >= torch.cuda.device_count():
        visible = torch.cuda.device_count()
        raise ConfigError("LOCAL_RANK", f"environment variable is {local_rank} but this node has {visible} visible CUDA device(s): start at "
                          f"most {visible} process(es) per node (torchrun --nproc-per-node {visible}), or hide the "
                          "GPUs (CUDA_VISIBLE_DEVICES=) to run every process on the CPU with gloo")
    for name in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise ConfigError(name, f"WORLD_SIZE={world} but {name} is not set; launch with torchrun")
    if not dist.is_initialized():
        backend = backend or ("nccl" if use_cuda else "gloo")
        if use_cuda:
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend=backend,
            init_method="env://",
            timeout=datetime.timedelta(minutes=timeout_minutes),
            # Binding NCCL to the device up front avoids a lazy, guessed device in the first collective.
            **({"device_id": device} if backend == "nccl" else {}),
        )
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, device)


def is_distributed() -> bool:
    """True once a process group of more than one process is initialized."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    """Rank 0 writes checkpoints, logs and prints; the others only compute."""
    return rank() == 0


def is_launch_rank_zero() -> bool:
    """Whether torchrun started this process as rank 0 (a plain run is). Unlike `is_main`, which answers for a
    world of one once `destroy` has left the group, this holds after the run too: the command line's report
    after training comes from one process, not from every rank."""
    return _env_int("RANK", 0) == 0


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def destroy() -> None:
    """Leave the process group (call once at the end of a run; harmless when none exists)."""
    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() > 1:
            _wait_for_every_rank()
        dist.destroy_process_group()


def _wait_for_every_rank() -> None:
    """Return once every rank has returned from its last collective, so that none tears the group down (closes
    its sockets, exits) while a peer still waits for its share.

    A collective is no such fence: a rank leaves it once its own messages are sent and its peers' received, and
    a peer can still be waiting. With nothing but a gloo barrier before `destroy_process_group`, a 2-rank CI run
    hung at the end (one rank past the barrier and gone, the other waiting) where the barrier had replaced the
    abort "terminate called without an active exception" seen about once in six runs without one. The
    rendezvous store is outside the group. Its server is torchrun's launcher, or rank 0 where a launcher without
    an agent store set the environment: so rank 0 leaves last, once every other rank has had its answer.
    """
    from torch.distributed.distributed_c10d import _get_default_store

    store, rank, world = _get_default_store(), dist.get_rank(), dist.get_world_size()
    store.set(f"rmkit/finished/{rank}", "1")
    store.wait([f"rmkit/finished/{r}" for r in range(world)])
    if rank == 0:
        store.wait([f"rmkit/left/{r}" for r in range(1, world)])
    else:
        store.set(f"rmkit/left/{rank}", "1")


def _collective_device() -> torch.device:
    # NCCL only reduces CUDA tensors; gloo reduces CPU tensors.
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduce `tensor` (any shape) over all ranks in place with "sum", "max" or "min"; returns it.

    A CPU tensor under NCCL takes a round trip through the GPU (a host-device sync point).
    """
    if not is_distributed():
        return tensor
    reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
    device = _collective_device()
    if tensor.device == device:
        dist.all_reduce(tensor, op=reduce_op)
        return tensor
    moved = tensor.to(device)
    dist.all_reduce(moved, op=reduce_op)
    tensor.copy_(moved)
    return tensor


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` over all ranks in place (global counts: `global_valid_seqs`, `global_valid_toks`)."""
    return all_reduce(tensor, "sum")


def all_gather_cat(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's `tensor` `[n_r, ...]` along dim 0 in rank order -> `[sum n_r, ...]`.

    Ranks may hold different `n_r` (the last validation batch is short); rows are padded to the
    largest `n_r` for the collective and the padding is dropped again.
    """
    if not is_distributed():
        return tensor
    device = _collective_device()
    local = tensor.to(device)
    count = torch.tensor([local.shape[0]], device=device, dtype=torch.long)
    counts = [torch.zeros_like(count) for _ in range(world_size())]
    dist.all_gather(counts, count)
    sizes = [int(c.item()) for c in counts]
    padded = local.new_zeros((max(sizes), *local.shape[1:]))
    padded[: local.shape[0]] = local
    gathered = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(gathered, padded)
    return torch.cat([g[:n] for g, n in zip(gathered, sizes)]).to(tensor.device)


def all_gather_object(obj: object) -> list:
    """Every rank's picklable `obj`, in rank order (a list of one element in a single process)."""
    if not is_distributed():
        return [obj]
    out: list = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: object, src: int = 0) -> object:
    """Rank `src`'s picklable `obj` on every rank (e.g. the resume step rank 0 chose)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def shard(items: Sequence, rank_: int | None = None, world: int | None = None) -> list:
    """This rank's contiguous share of a global batch `items` (e.g. the pair indices of one step).

    Rank r gets `items[r*n // W : (r+1)*n // W]`: every item goes to exactly one rank and the shares
    differ in size by at most one. A rank whose share is empty still takes part in the collectives
    (its counts are zero), so global-count normalization stays exact for any batch size.
    """
    rank_ = rank() if rank_ is None else rank_
    world = world_size() if world is None else world
    n = len(items)
    return list(items[rank_ * n // world : (rank_ + 1) * n // world])


def _sum_gradients_hook(process_group, bucket):
    # DDP's default hook averages gradients over ranks. rmkit's losses are already divided by the
    # *global* counts (docs/design.md), so each rank holds its share of the global-batch gradient and the
    # right reduction is the plain sum.
    work = dist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def wrap_data_parallel(module: torch.nn.Module, info: DistInfo) -> torch.nn.Module:
    """`module` inside DistributedDataParallel with summed (not averaged) gradients; unchanged when
    single-process. DDP broadcasts rank 0's parameters and buffers at construction, so every rank
    starts from the same weights. Use `no_sync()` on all but the last micro-batch of a step."""
    if not is_distributed():
        return module
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [info.device.index] if info.device.type == "cuda" else None
    wrapped = DistributedDataParallel(module, device_ids=device_ids)
    wrapped.register_comm_hook(None, _sum_gradients_hook)
    return wrapped


def sync_gradients(module: torch.nn.Module, sync: bool):
    """Context for one micro-batch's backward: DDP and FSDP2 reduce gradients only when `sync` (the last
    micro-batch of a step); the others accumulate locally. A no-op for an unwrapped module."""
    from torch.distributed.fsdp import FSDPModule

    for unit in module.modules():
        if isinstance(unit, FSDPModule):  # FSDP2 keeps unsharded gradients until the synced backward
            unit.set_requires_gradient_sync(sync, recurse=False)
    if sync or not hasattr(module, "no_sync"):
        return contextlib.nullcontext()
    return module.no_sync()


# ------------------------------------------------------------------------------------------- FSDP2
def fully_shard_model(root: torch.nn.Module, units: Sequence[torch.nn.Module], info: DistInfo,
                      reshard_after_forward: bool = True, cpu_offload: bool = False,
                      param_dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Shard `root` with FSDP2: `fully_shard` on each of `units` (transformer blocks, the input
    embeddings), then on `root`, which keeps what is left. Unchanged when single-process; rank 0's
    weights are broadcast first. Returns `root` (the same object, its class now an `FSDPModule`).

    Gradients are summed over ranks (divide factor 1), as `wrap_data_parallel` does: the losses are
    already divided by the global counts. Parameters are reduced in float32 whatever `param_dtype`.
    Build the optimizer afterwards: sharding replaces every parameter by a DTensor shard.
    """
    if not is_distributed():
        return root
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    # Each rank keeps its slice of its own copy: start every rank from rank 0's weights, as DDP does.
    for tensor in [*root.parameters(), *root.buffers()]:
        dist.broadcast(tensor.detach(), src=0)
    mesh = init_device_mesh(info.device.type, (world_size(),))
    options = {
        "mesh": mesh,
        "reshard_after_forward": reshard_after_forward,
        "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32),
        "offload_policy": CPUOffloadPolicy(pin_memory=info.device.type == "cuda") if cpu_offload else OffloadPolicy(),
    }
    for unit in units:
        fully_shard(unit, **options)
    fully_shard(root, **options)
    for module in root.modules():
        if isinstance(module, torch.distributed.fsdp.FSDPModule):
            # A plain SUM reduce-scatter (no PREMUL_SUM, which gloo lacks; zero-copy on NCCL), divided by 1.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    # FSDP2 takes as root the first sharded module to run forward. The loop looks up the embeddings (a
    # unit of their own) before it calls the model, and validation calls the model directly: make
    # `root` the root now, whatever runs first.
    fully_shard.state(root)._lazy_init()
    return root


def is_sharded(module: torch.nn.Module) -> bool:
    """True when `module` or a module inside it is sharded by FSDP2."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in module.modules())


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s whole state dict gathered on rank 0, on the CPU (other ranks get an empty dict); call
    it on every rank. Parameter names are the model's own (sharding does not change them)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
