"""Run under `torchrun --nproc-per-node 2`: exercises rmkit.distributed and writes rank_<r>.json to argv[1]."""

import json
import sys
from pathlib import Path

import torch

from rmkit import distributed as dist
from rmkit.metrics import RewardMetricsAccumulator


def main(out_dir: str) -> None:
    info = dist.init_distributed()
    r, world = dist.rank(), dist.world_size()
    summed = dist.all_reduce_sum(torch.tensor([float(r + 1), 10.0]))
    largest = dist.all_reduce(torch.tensor([float(r)]), "max")
    # Uneven rows per rank: rank 0 holds 3 rows, rank 1 holds 1, as a short last validation batch would.
    rows = torch.arange(3 - 2 * r, dtype=torch.float32)[:, None] + 100 * r
    gathered = dist.all_gather_cat(rows.expand(-1, 2).contiguous())
    accumulator = RewardMetricsAccumulator()  # rewards 0, 1, 2 (rank 0) and 100 (rank 1); each pair correct
    accumulator.update(rows[:, 0] + 1, rows[:, 0])
    pair_metrics = accumulator.compute()
    chosen = dist.broadcast_object({"resume_step": 7} if dist.is_main() else None)
    objects = dist.all_gather_object(f"rank{r}")
    # DDP with summed gradients over two micro-batches (the first under no_sync): rank r feeds x = r + 1.
    torch.manual_seed(r)  # different init per rank: DDP must broadcast rank 0's weights
    linear = torch.nn.Linear(3, 1)
    model = dist.wrap_data_parallel(linear, info)
    x = torch.full((2, 3), float(r + 1))
    with model.no_sync():
        model(x).sum().backward()
    model(x).sum().backward()
    dist.barrier()
    result = {
        "grad": linear.weight.grad.tolist(),
        "weight": linear.weight.detach().tolist(),
        "rank": r,
        "world": world,
        "info_rank": info.rank,
        "is_main": dist.is_main(),
        "sum": summed.tolist(),
        "max": largest.tolist(),
        "gathered": gathered.tolist(),
        "pair_metrics": pair_metrics,
        "broadcast": chosen,
        "objects": objects,
        "shard": dist.shard(list(range(5))),
    }
    Path(out_dir, f"rank_{r}.json").write_text(json.dumps(result))
    dist.destroy()


if __name__ == "__main__":
    main(sys.argv[1])
