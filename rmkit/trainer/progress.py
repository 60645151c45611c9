"""What a run shows while it trains: a tqdm bar over optimizer steps and the throughput window behind it."""

from __future__ import annotations

import sys

from tqdm import tqdm

from rmkit import distributed as dist


class ProgressBar:
    """A tqdm bar over optimizer steps showing loss, accuracy, pairs/s and tokens/s (disabled: silent)."""

    def __init__(self, total: int, enabled: bool, initial: int = 0, items: str = "pairs"):
        self.items = items  # what the per-second rate counts (SFT: "seqs")
        self._bar = tqdm(total=total, initial=initial, disable=not enabled, desc="train", unit="step",
                         dynamic_ncols=True, file=sys.stderr)

    def update(self, loss: float, acc: float, pairs_per_s: float, tokens_per_s: float) -> None:
        self._bar.set_postfix(loss=f"{loss:.4f}", acc=f"{acc:.3f}", **{f"{self.items}_s": f"{pairs_per_s:.1f}"},
                              tok_s=f"{tokens_per_s:.0f}", refresh=False)
        self._bar.update(1)

    def advance(self, **postfix: float) -> None:
        """One step done, showing `postfix` (a recipe's own numbers, e.g. GRPO's reward and KL)."""
        self._bar.set_postfix({k: f"{v:.4g}" for k, v in postfix.items()}, refresh=False)
        self._bar.update(1)

    def write(self, message: str) -> None:
        """Print `message` above the bar (rank 0 only, also when the bar itself is off)."""
        if dist.is_main():
            self._bar.write(message, file=sys.stderr)

    def close(self) -> None:
        self._bar.close()


class StepWindow:
    """Training numbers since the last logged step: mean loss and accuracy per step, pairs/s and
    real tokens/s over the steps' own time (validation and checkpoints excluded)."""

    def __init__(self):
        self.steps, self.time, self.pairs, self.tokens, self.loss, self.acc = 0, 0.0, 0, 0, 0.0, 0.0

    def add(self, seconds: float, pairs: int, tokens: int, loss: float, acc: float) -> None:
        self.steps += 1
        self.time, self.pairs, self.tokens = self.time + seconds, self.pairs + pairs, self.tokens + tokens
        self.loss, self.acc = self.loss + loss, self.acc + acc

    def rates(self) -> tuple[float, float]:
        """`(pairs/s, tokens/s)`."""
        seconds = max(self.time, 1e-9)
        return self.pairs / seconds, self.tokens / seconds

    def metrics(self) -> dict[str, float]:
        pairs_per_s, tokens_per_s = self.rates()
        steps = max(self.steps, 1)
        return {"train/loss": self.loss / steps, "train/acc": self.acc / steps,
                "train/pairs_per_s": pairs_per_s, "train/tokens_per_s": tokens_per_s}
