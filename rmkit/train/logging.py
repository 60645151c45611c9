"""Where the loop's numbers go: `metrics.jsonl` (always), TensorBoard (when installed), a tqdm bar."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from tqdm import tqdm


class MetricsLogger:
    """Appends `{"step": s, name: value, ...}` lines to `<log_dir>/metrics.jsonl` and mirrors them to
    TensorBoard. `history` keeps every logged record for the end-of-run plots."""

    def __init__(self, log_dir: str | Path, tensorboard: bool = True, backends: list | None = None,
                 purge_step: int | None = None):
        # backends: more sinks with `log(metrics, step)` / `close()` (W&B, MLflow: rmkit.train.loggers).
        # purge_step: a resumed run drops TensorBoard events from this step on (the killed run's tail).
        self.backends = list(backends or [])
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.log_dir / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self.history: list[dict] = []
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                print("rmkit: tensorboard is not installed; logging to metrics.jsonl only", file=sys.stderr)
            else:
                self._tb = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Record `metrics` at `step` (non-finite values are written as null in JSON)."""
        record = {"step": step, **metrics}
        self.history.append(record)
        clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in record.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)):
                    self._tb.add_scalar(key, value, step)
        for backend in self.backends:
            backend.log(metrics, step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        for backend in self.backends:
            backend.close()


class NullLogger:
    """What ranks other than 0 log to: nothing."""

    history: list[dict] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        pass

    def close(self) -> None:
        pass


class ProgressBar:
    """A tqdm bar over optimizer steps showing loss, accuracy, pairs/s and tokens/s (disabled: silent)."""

    def __init__(self, total: int, enabled: bool, initial: int = 0):
        self._bar = tqdm(total=total, initial=initial, disable=not enabled, desc="train", unit="step",
                         dynamic_ncols=True, file=sys.stderr)

    def update(self, loss: float, acc: float, pairs_per_s: float, tokens_per_s: float) -> None:
        self._bar.set_postfix(loss=f"{loss:.4f}", acc=f"{acc:.3f}", pairs_s=f"{pairs_per_s:.1f}",
                              tok_s=f"{tokens_per_s:.0f}", refresh=False)
        self._bar.update(1)

    def write(self, message: str) -> None:
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
