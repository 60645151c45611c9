"""Reward-model metrics: hand values, a loop reference, accumulation, and 2 gloo processes."""

import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rmkit.losses import PreferenceLoss
from rmkit.metrics import METRIC_KEYS, RewardMetricsAccumulator, reward_model_metrics


def _reference(chosen: list[float], rejected: list[float]) -> dict:
    n = len(chosen)
    everything = chosen + rejected
    mean = sum(everything) / (2 * n)
    return {
        "loss": sum(math.log1p(math.exp(-(c - r))) for c, r in zip(chosen, rejected)) / n,
        "acc": sum(c > r for c, r in zip(chosen, rejected)) / n,
        "rewards_chosen_mean": sum(chosen) / n,
        "rewards_rejected_mean": sum(rejected) / n,
        "rewards_all_mean": mean,
        "rewards_all_std": math.sqrt(sum((x - mean) ** 2 for x in everything) / (2 * n - 1)),
        "num_pairs": n,
    }


def _assert_metrics(got: dict, want: dict, rel=1e-12):
    assert tuple(got) == METRIC_KEYS
    for key in METRIC_KEYS:
        assert got[key] == pytest.approx(want[key], rel=rel, abs=1e-12), key
    assert isinstance(got["num_pairs"], int)


def test_hand_values_and_ties():
    # Pairs (1, 0) and (0, 0): loss = (log(1 + e^-1) + ln 2) / 2; the tie is wrong -> acc 0.5.
    got = reward_model_metrics(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]))
    assert got["loss"] == pytest.approx((math.log1p(math.exp(-1)) + math.log(2)) / 2)
    assert got["acc"] == 0.5
    assert got["rewards_all_mean"] == 0.25
    assert got["rewards_all_std"] == pytest.approx(0.5)  # unbiased: sqrt((0.5625 + 3 * 0.0625) / 3)
    assert got["num_pairs"] == 2


def test_matches_loop_reference_and_preference_loss():
    chosen, rejected = torch.randn(37), torch.randn(37)
    got = reward_model_metrics(chosen, rejected)
    _assert_metrics(got, _reference(chosen.double().tolist(), rejected.double().tolist()))
    interleaved = torch.stack([chosen, rejected], 1).reshape(-1)  # [c0, r0, c1, r1, ...]
    loss, metrics = PreferenceLoss()(interleaved, {"sample_mask": torch.ones(74)}, 74, None)
    assert got["loss"] == pytest.approx(loss.item(), rel=1e-6)  # float32 loss vs float64 metrics
    assert got["acc"] == pytest.approx(float(metrics["accuracy"]), rel=1e-6)


def test_accumulator_over_batches_equals_concatenated():
    chosen, rejected = torch.randn(20, 1), torch.randn(20, 1)
    acc = RewardMetricsAccumulator()
    for lo, hi in [(0, 3), (3, 4), (4, 20)]:
        acc.update(chosen[lo:hi], rejected[lo:hi])
    _assert_metrics(acc.compute(), reward_model_metrics(chosen, rejected))
    acc.reset()
    with pytest.raises(ValueError, match="at least one pair"):
        acc.compute()


def test_mismatched_sizes_are_clear_errors():
    with pytest.raises(ValueError, match="differ in size"):
        reward_model_metrics(torch.zeros(3), torch.zeros(2))


def _rank_data(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank 0 holds 3 pairs in 2 batches, rank 1 holds 5 pairs in 2 batches (uneven on purpose)."""
    g = torch.Generator().manual_seed(100 + rank)
    sizes = [1, 2] if rank == 0 else [4, 1]
    return [(torch.randn(n, generator=g), torch.randn(n, generator=g)) for n in sizes]


def _worker(rank: int, world: int, out_dir: str) -> None:
    # A FileStore rendezvous: no port to race for with other test runs on the machine.
    store = f"file://{os.path.join(out_dir, 'store')}"
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world)
    try:
        acc = RewardMetricsAccumulator()
        for chosen, rejected in _rank_data(rank):
            acc.update(chosen, rejected)
        torch.save(acc.compute(), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_equal_single_process_on_concatenated_data(tmp_path):
    mp.spawn(_worker, args=(2, str(tmp_path)), nprocs=2, join=True)
    batches = _rank_data(0) + _rank_data(1)  # rank order
    chosen = torch.cat([c for c, _ in batches])
    rejected = torch.cat([r for _, r in batches])
    want = reward_model_metrics(chosen, rejected)
    assert want["num_pairs"] == 8
    for rank in range(2):
        # Same float64 arithmetic on the same values in the same order: equal to 1e-15.
        _assert_metrics(torch.load(tmp_path / f"rank{rank}.pt"), want, rel=1e-15)
