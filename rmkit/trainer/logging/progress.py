"""What a run shows while it trains: a tqdm bar over optimizer steps and the throughput window behind it."""

from __future__ import annotations

import sys

from tqdm import tqdm

from rmkit import distributed as dist


class ProgressBar:
    """A tqdm bar over optimizer steps showing the recipe's numbers (disabled: silent)."""

    def __init__(self, total: int, enabled: bool, initial: int = 0):
        self._bar = tqdm(total=total, initial=initial, disable=not enabled, desc="train", unit="step",
                         dynamic_ncols=True, file=sys.stderr)

    def advance(self, **postfix: float) -> None:
        """One step done, showing `postfix` (a recipe's own numbers: loss and accuracy, GRPO's reward and KL)."""
        self._bar.set_postfix({k: f"{v:.4g}" for k, v in postfix.items()}, refresh=False)
        self._bar.update(1)

    def write(self, message: str) -> None:
        """Print `message` above the bar (rank 0 only, also when the bar itself is off)."""
        if dist.is_main():
            self._bar.write(message, file=sys.stderr)

    def close(self) -> None:
        self._bar.close()


class StepWindow:
    """Training numbers over a run of steps (since the last logged line, or the whole run): each metric's
    mean over the steps that reported it, items/s and real tokens/s over the steps' own time (validation and
    checkpoints excluded). Metrics may be 0-dim tensors: they are summed where they are and read on the host
    by `means`."""

    def __init__(self):
        self.steps, self.time, self.items, self.tokens = 0, 0.0, 0, 0
        self.sums: dict = {}
        self.counts: dict[str, int] = {}

    @classmethod
    def restored(cls, saved: dict | None) -> StepWindow:
        """A window from `state()` as a checkpoint kept it (None: an empty one)."""
        window = cls()
        for key, value in (saved or {}).items():
            if key in vars(window):
                setattr(window, key, value)
        return window

    def state(self) -> dict:
        return {"steps": self.steps, "time": self.time, "items": self.items, "tokens": self.tokens,
                "sums": {key: float(value) for key, value in self.sums.items()}, "counts": dict(self.counts)}

    def add(self, seconds: float, items: int, tokens: int, metrics: dict) -> None:
        self.steps += 1
        self.time, self.items, self.tokens = self.time + seconds, self.items + items, self.tokens + tokens
        for key, value in metrics.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
            self.counts[key] = self.counts.get(key, 0) + 1

    def rates(self) -> tuple[float, float]:
        """`(items/s, tokens/s)`."""
        seconds = max(self.time, 1e-9)
        return self.items / seconds, self.tokens / seconds

    def means(self) -> dict[str, float]:
        return {key: float(value) / self.counts[key] for key, value in self.sums.items()}
