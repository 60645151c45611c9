"""Batch samplers that keep padding small, deterministic from a seed and resumable mid-epoch.

The samplers yield lists of record indices (use them as a `DataLoader` `batch_sampler`). An epoch's
batches depend only on `(seed, epoch)`. `state_dict()` records the epoch and how many batches were
consumed; `load_state_dict()` followed by iteration yields exactly the remaining batches.

With `num_replicas > 1` every data-parallel rank builds the same global batches and takes its own
contiguous slice of each (the slices of a global batch have similar lengths), so all ranks run the
same number of steps. A final short global batch is split as evenly as possible (slices differ by
at most one record); the loss normalizes by global counts, so uneven slices are exact.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence


def padding_fraction(batches: Sequence[Sequence[int]], lengths: Sequence) -> float:
    """Share of padded tokens: `1 - real / (rows x longest row)` summed over `batches`.

    `lengths[i]` is record i's token count, or a tuple of its rows' counts (a pair's chosen and
    rejected lengths), so for pairs the padding of the shorter side is counted too.
    """
    real = padded = 0
    for batch in batches:
        rows = [n for i in batch for n in (lengths[i] if isinstance(lengths[i], (tuple, list)) else (lengths[i],))]
        if rows:
            real += sum(rows)
            padded += len(rows) * max(rows)
    return 0.0 if padded == 0 else 1.0 - real / padded


def _split_evenly(items: list[int], parts: int) -> list[list[int]]:
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for part in range(parts):
        end = start + size + (part < extra)
        out.append(items[start:end])
        start = end
    return out


class _ResumableSampler:
    """Epoch, seed and resume bookkeeping shared by the samplers; subclasses build `_epoch_batches`."""

    def __init__(self, lengths: Sequence[int], seed: int, shuffle: bool, num_replicas: int, rank: int):
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas}), got {rank}")
        if len(lengths) < num_replicas:
            raise ValueError(f"{len(lengths)} records cannot feed {num_replicas} data-parallel ranks")
        self.lengths = list(lengths)
        self.seed, self.shuffle = seed, shuffle
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch = 0
        self.consumed = 0  # batches of the current epoch already handed out
        self._cache: tuple[int, list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate; a new epoch starts from its first batch."""
        if epoch != self.epoch:
            self.consumed = 0
        self.epoch = epoch

    def _rng(self) -> random.Random:
        return random.Random(self.seed * 1_000_003 + self.epoch)

    def _order(self, rng: random.Random) -> list[int]:
        order = list(range(len(self.lengths)))
        if self.shuffle:
            rng.shuffle(order)
        return order

    def batches(self) -> list[list[int]]:
        """This rank's batches for the current epoch (all of them, consumed or not)."""
        if self._cache is None or self._cache[0] != self.epoch:
            self._cache = (self.epoch, self._epoch_batches())
        return self._cache[1]

    def _epoch_batches(self) -> list[list[int]]:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.batches())

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.batches()
        while self.consumed < len(batches):
            batch = batches[self.consumed]
            self.consumed += 1
            yield batch
        # A finished epoch moves on: the next iteration (with or without set_epoch) is a new
        # shuffle, and a checkpoint taken now resumes at the next epoch's start.
        self.epoch, self.consumed = self.epoch + 1, 0

    def state_dict(self, batches_consumed: int | None = None, epoch: int | None = None) -> dict:
        """Resume state. A prefetching `DataLoader` runs the sampler ahead of training: then pass the
        epoch and the number of its batches the training loop actually consumed."""
        consumed = self.consumed if batches_consumed is None else batches_consumed
        epoch = self.epoch if epoch is None else epoch
        return {"epoch": epoch, "consumed": consumed, "seed": self.seed, "num_records": len(self.lengths)}

    def load_state_dict(self, state: dict) -> None:
        if state["seed"] != self.seed or state["num_records"] != len(self.lengths):
            raise ValueError(
                f"sampler state is for seed {state['seed']} and {state['num_records']} records, "
                f"not seed {self.seed} and {len(self.lengths)} records: the data or seed changed"
            )
        self.epoch, self.consumed = state["epoch"], state["consumed"]


class LengthGroupedBatchSampler(_ResumableSampler):
    """Batches of `batch_size` records of similar length, in random order.

    Each epoch: shuffle the records, cut them into mega-batches of `mega_batch_mult` global batches,
    sort each mega-batch by length (longest first), cut it into global batches of
    `batch_size * num_replicas`, then shuffle the order of all global batches (as TRL's and HF's
    length-grouped samplers do). `lengths[i]` is record i's padded length (for a pair: the longer side).
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        mega_batch_mult: int = 50,
        num_replicas: int = 1,
        rank: int = 0,
    ):
        if batch_size < 1 or mega_batch_mult < 1:
            raise ValueError("batch_size and mega_batch_mult must be at least 1")
        super().__init__(lengths, seed, shuffle, num_replicas, rank)
        self.batch_size, self.drop_last, self.mega_batch_mult = batch_size, drop_last, mega_batch_mult

    def _epoch_batches(self) -> list[list[int]]:
        rng = self._rng()
        order = self._order(rng)
        global_size = self.batch_size * self.num_replicas
        mega = global_size * self.mega_batch_mult
        global_batches = []
        for start in range(0, len(order), mega):
            chunk = sorted(order[start:start + mega], key=lambda i: -self.lengths[i])
            global_batches += [chunk[i:i + global_size] for i in range(0, len(chunk), global_size)]
        full = [b for b in global_batches if len(b) == global_size]
        short = [b for b in global_batches if len(b) < global_size]
        if self.shuffle:
            rng.shuffle(full)
        if not self.drop_last:
            full += short  # only the very last chunk can be short; it runs last
        return [_split_evenly(b, self.num_replicas)[self.rank] for b in full]


class PrefixGroupedBatchSampler(_ResumableSampler):
    """Batches of `batch_size` records that share beginnings: a process reward model's solutions of one problem
    together (`rmkit.models.prefix_tree` then computes what they share once).

    The records are sorted by their token ids once (so records with a common beginning are neighbours). Each
    epoch: rotate that order by a random offset below the global batch size (the batch boundaries move from epoch
    to epoch), cut it into global batches of `batch_size * num_replicas`, shuffle the order of the full batches
    (the short one, if any, runs last). Each rank takes its contiguous slice of every global batch.
    """

    def __init__(self, sequences: Sequence[Sequence[int]], batch_size: int, seed: int = 0, shuffle: bool = True,
                 num_replicas: int = 1, rank: int = 0):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        super().__init__([len(s) for s in sequences], seed, shuffle, num_replicas, rank)
        self.batch_size = batch_size
        self.sorted = sorted(range(len(sequences)), key=sequences.__getitem__)  # stable: ties in index order

    def _epoch_batches(self) -> list[list[int]]:
        rng = self._rng()
        global_size = self.batch_size * self.num_replicas
        shift = rng.randrange(min(global_size, len(self.sorted))) if self.shuffle else 0
        order = self.sorted[shift:] + self.sorted[:shift]
        global_batches = [order[i:i + global_size] for i in range(0, len(order), global_size)]
        full = [b for b in global_batches if len(b) == global_size]
        if self.shuffle:
            rng.shuffle(full)
        full += [b for b in global_batches if len(b) < global_size]
        return [_split_evenly(b, self.num_replicas)[self.rank] for b in full]


class TokenBudgetBatchSampler(_ResumableSampler):
    """Batches whose padded size `rows_per_record x records x longest` stays within `max_tokens`.

    Each epoch: shuffle, cut into mega-batches of `mega_batch_size` records, sort each by length,
    fill batches greedily (a record longer than the budget gets a batch of its own), shuffle the
    batch order. With `num_replicas > 1`, rank r takes every `num_replicas`-th batch; the largest
    batches are split in two until the count divides evenly, so all ranks take the same number of
    steps (if every batch holds a single record, the first batches are repeated, as
    `DistributedSampler` pads). Use `rows_per_record=2` for preference pairs (both rows are padded to the longest).
    """

    def __init__(
        self,
        lengths: Sequence[int],
        max_tokens: int,
        seed: int = 0,
        shuffle: bool = True,
        max_batch_size: int | None = None,
        rows_per_record: int = 1,
        mega_batch_size: int = 2048,
        num_replicas: int = 1,
        rank: int = 0,
    ):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        super().__init__(lengths, seed, shuffle, num_replicas, rank)
        self.max_tokens, self.max_batch_size = max_tokens, max_batch_size
        self.rows_per_record, self.mega_batch_size = rows_per_record, mega_batch_size

    def _fill(self, chunk: list[int]) -> list[list[int]]:
        batches: list[list[int]] = []
        for index in chunk:  # longest first, so a batch's first record is its longest
            batch = batches[-1] if batches else None
            fits = batch and (len(batch) + 1) * self.rows_per_record * self.lengths[batch[0]] <= self.max_tokens
            if fits and (self.max_batch_size is None or len(batch) < self.max_batch_size):
                batch.append(index)
            else:
                batches.append([index])
        return batches

    def _epoch_batches(self) -> list[list[int]]:
        rng = self._rng()
        order = self._order(rng)
        batches = []
        for start in range(0, len(order), self.mega_batch_size):
            chunk = sorted(order[start:start + self.mega_batch_size], key=lambda i: -self.lengths[i])
            batches += self._fill(chunk)
        if self.shuffle:
            rng.shuffle(batches)
        while len(batches) % self.num_replicas:
            largest = max(range(len(batches)), key=lambda i: len(batches[i]))
            batch = batches[largest]
            if len(batch) == 1:  # all single records: repeat the first ones, as DistributedSampler pads
                batches += batches[: self.num_replicas - len(batches) % self.num_replicas]
                break
            batches[largest: largest + 1] = [batch[: len(batch) // 2], batch[len(batch) // 2:]]
        return batches[self.rank:: self.num_replicas]
