"""TEMPORARY stand-in for `rmkit.data.sampler.LengthGroupedBatchSampler` until the data branch lands."""

from __future__ import annotations

import random


class LengthGroupedBatchSampler:
    """Mega-batches of `batch_size * 50` shuffled indices, sorted by length and cut into batches,
    batch order shuffled; deterministic from `seed` and the epoch; resumable mid-epoch."""

    def __init__(self, lengths, batch_size, seed, shuffle=True, drop_last=False):
        self.lengths, self.batch_size, self.seed = list(lengths), batch_size, seed
        self.epoch, self.position = 0, 0

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def _batches(self) -> list[list[int]]:
        rng = random.Random(self.seed * 1000003 + self.epoch)
        order = list(range(len(self.lengths)))
        rng.shuffle(order)
        mega = self.batch_size * 50
        batches = []
        for start in range(0, len(order), mega):
            group = sorted(order[start : start + mega], key=lambda i: self.lengths[i], reverse=True)
            batches += [group[i : i + self.batch_size] for i in range(0, len(group), self.batch_size)]
        rng.shuffle(batches)
        return batches

    def __iter__(self):
        batches = self._batches()
        while self.position < len(batches):
            self.position += 1
            yield batches[self.position - 1]
        self.epoch, self.position = self.epoch + 1, 0

    def __len__(self) -> int:
        return -(-len(self.lengths) // self.batch_size)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
