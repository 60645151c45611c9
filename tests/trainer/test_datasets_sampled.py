"""`sampled_items`: the items a run's first steps take, every rank's share, from a copy of the sampler."""

from rmkit.data.sampler import LengthGroupedBatchSampler
from rmkit.trainer.datasets import sampled_items

LENGTHS = [(i * 37) % 101 for i in range(50)]


def test_the_items_of_the_first_steps_over_epochs_and_ranks():
    ranks = [LengthGroupedBatchSampler(LENGTHS, batch_size=3, seed=7, mega_batch_mult=2, num_replicas=2, rank=r)
             for r in range(2)]
    per_epoch = len(ranks[0])
    steps = per_epoch + 3  # into the second epoch
    expected = set()
    for sampler in ranks:
        taken = iter(sampler)
        for _ in range(steps):
            try:
                batch = next(taken)
            except StopIteration:
                taken = iter(sampler)  # the next epoch
                batch = next(taken)
            expected.update(batch)
    fresh = LengthGroupedBatchSampler(LENGTHS, batch_size=3, seed=7, mega_batch_mult=2, num_replicas=2, rank=0)
    assert sampled_items(fresh, steps) == sorted(expected)
    assert fresh.epoch == 0 and fresh.consumed == 0  # the sampler itself did not move
    assert len(sampled_items(fresh, 2)) == 12  # two global batches of 6
