"""Run under `torchrun --nproc-per-node 2`: exercises rmkit.distributed and writes rank_<r>.json to argv[1]."""

import json
import sys
from pathlib import Path

import torch

from rmkit import distributed as dist


def main(out_dir: str) -> None:
    info = dist.init_distributed()
    r, world = dist.rank(), dist.world_size()
    summed = dist.all_reduce_sum(torch.tensor([float(r + 1), 10.0]))
    largest = dist.all_reduce(torch.tensor([float(r)]), "max")
    # Uneven rows per rank: rank 0 holds 3 rows, rank 1 holds 1, as a short last validation batch would.
    rows = torch.arange(3 - 2 * r, dtype=torch.float32)[:, None] + 100 * r
    gathered = dist.all_gather_cat(rows.expand(-1, 2).contiguous())
    chosen = dist.broadcast_object({"resume_step": 7} if dist.is_main() else None)
    objects = dist.all_gather_object(f"rank{r}")
    dist.barrier()
    result = {
        "rank": r,
        "world": world,
        "info_rank": info.rank,
        "is_main": dist.is_main(),
        "sum": summed.tolist(),
        "max": largest.tolist(),
        "gathered": gathered.tolist(),
        "broadcast": chosen,
        "objects": objects,
        "shard": dist.shard(list(range(5))),
    }
    Path(out_dir, f"rank_{r}.json").write_text(json.dumps(result))
    dist.destroy()


if __name__ == "__main__":
    main(sys.argv[1])
