"""rmkit.distributed: single-process no-ops, and real collectives across 2 gloo processes under torchrun."""

import json
import os
from pathlib import Path

import pytest
import torch

from rmkit import distributed as dist
from tests.support.launch import torchrun

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_single_process_is_rank_zero_of_one(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    info = dist.init_distributed()
    assert (info.rank, info.world_size, info.local_rank) == (0, 1, 0)
    assert not dist.is_distributed() and dist.is_main() and dist.world_size() == 1
    t = torch.tensor([1.0, 2.0])
    assert dist.all_reduce_sum(t) is t and t.tolist() == [1.0, 2.0]
    assert dist.all_gather_cat(t) is t
    assert dist.all_gather_object("x") == ["x"] and dist.broadcast_object(3) == 3
    dist.barrier()
    dist.destroy()


def test_missing_rendezvous_variable_is_a_config_error(monkeypatch):
    from rmkit.errors import ConfigError

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match="MASTER_ADDR"):
        dist.init_distributed()


def test_more_processes_than_gpus_is_a_config_error(monkeypatch):
    """torchrun --nproc-per-node 2 on a one-GPU node: an error naming LOCAL_RANK and what to do, not CUDA's
    'invalid device ordinal' traceback (seen on a one-H100 machine)."""
    from rmkit.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for name, value in {"WORLD_SIZE": "2", "LOCAL_RANK": "1", "RANK": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=r"LOCAL_RANK.*1 visible CUDA device.*--nproc-per-node 1.*CUDA_VISIBLE_DEVICES"):
        dist.init_distributed()


@pytest.mark.parametrize("n,world", [(5, 2), (8, 2), (1, 2), (7, 3), (0, 2)])
def test_shard_covers_every_item_once(n, world):
    items = list(range(n))
    shards = [dist.shard(items, r, world) for r in range(world)]
    assert sum(shards, []) == items
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_two_gloo_processes(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    torchrun([str(Path(__file__).with_name("_dist_worker.py")), str(tmp_path)], env, timeout=120)
    results = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in range(2)]
    for r, res in enumerate(results):
        assert (res["rank"], res["world"], res["info_rank"], res["is_main"]) == (r, 2, r, r == 0)
        assert res["sum"] == [3.0, 20.0]
        assert res["max"] == [1.0]
        assert res["gathered"] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [100.0, 100.0]]
        assert res["broadcast"] == {"resume_step": 7}
        # Every rank's pairs: chosen 1, 2, 3, 101 and rejected 0, 1, 2, 100 (means 26.75 and 25.75).
        assert res["pair_metrics"]["num_pairs"] == 4 and res["pair_metrics"]["acc"] == 1.0
        assert res["pair_metrics"]["rewards_chosen_mean"] == 26.75
        assert res["objects"] == ["rank0", "rank1"]
        # d/dw sum(w.x + b) = 2 rows * x per backward, 2 backwards per rank, summed over ranks: 4*1 + 4*2.
        assert res["grad"] == [[12.0, 12.0, 12.0]]
    assert results[0]["weight"] == results[1]["weight"]
    assert results[0]["shard"] == [0, 1] and results[1]["shard"] == [2, 3, 4]
