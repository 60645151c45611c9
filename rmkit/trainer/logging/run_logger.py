"""Where a run's numbers go: `metrics.jsonl` (always), TensorBoard (when installed) and the tracker
backends of `rmkit.trainer.logging.trackers`; `open_logger` opens them for a run, fresh or resumed. Sample
generations, written at validation by every recipe that generates, go to `samples.jsonl` in one format
(`append_samples`), rewound on resume by the same rule as the metrics."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

from rmkit import distributed as dist
from rmkit.config import Config, config_to_dict
from rmkit.trainer.logging.trackers import build_loggers

SAMPLES = "samples.jsonl"


class RunLogger:
    """Appends `{"step": s, name: value, ...}` lines to `<log_dir>/metrics.jsonl` and mirrors them to
    TensorBoard. `history` keeps every logged record for the end-of-run plots."""

    def __init__(self, log_dir: str | Path, tensorboard: bool = True, backends: list | None = None,
                 purge_step: int | None = None):
        # backends: more sinks with `log(metrics, step)` / `close()` (W&B, MLflow: rmkit.trainer.logging.trackers).
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


def open_logger(cfg: Config, log_dir: Path, resumed_step: int | None, finished: bool) -> RunLogger | NullLogger:
    """Rank 0: metrics.jsonl, TensorBoard, W&B and MLflow as configured; a resumed run first cuts
    metrics.jsonl and samples.jsonl back to its checkpoint's step (and its final validation when
    `finished`, as it runs again). Other ranks log nothing."""
    if not dist.is_main():
        return NullLogger()
    resumed = resumed_step is not None
    history = rewind_jsonl(log_dir / "metrics.jsonl", resumed_step, finished) if resumed else []
    if resumed:
        rewind_jsonl(log_dir / SAMPLES, resumed_step, finished)
    backends = build_loggers(cfg.logger.wandb, cfg.logger.mlflow, log_dir, config_to_dict(cfg))
    logger = RunLogger(log_dir, tensorboard=cfg.logger.tensorboard, backends=backends,
                       purge_step=resumed_step + 1 if resumed else None)
    logger.history = history
    return logger


def rewind_jsonl(path: Path, step: int, revalidates: bool = False) -> list[dict]:
    """Drop the records after `step` from a run's JSONL log (`metrics.jsonl`, `samples.jsonl`: a killed run
    logged past its last checkpoint) so the resumed run's log reads as one uninterrupted run; return the
    records kept (the plot history).

    `revalidates`: the resumed run validates at `step` again (it resumes from the run's last step, whose
    checkpoint follows the final validation), so that step's validation records go too: a record is one
    when it has a `validation...` key or a `completion` (a sample generation)."""
    if not path.is_file():
        return []
    kept_lines, history = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a line cut short by the kill
            continue
        at = record.get("step", math.inf)
        validation = "completion" in record or any(k.startswith("validation") for k in record)
        if at <= step and not (revalidates and at == step and validation):
            kept_lines.append(line)
            history.append({k: (math.nan if v is None else v) for k, v in record.items()})
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept_lines), encoding="utf-8")
    tmp.replace(path)
    return history


def append_samples(log_dir: Path, step: int, samples: list[dict]) -> Path:
    """Append generations to `<log_dir>/samples.jsonl`, one line each: `{"step", "set", "source", "prompt",
    "completion", ...}` (`samples` give the rest in that order, then the recipe's own fields, e.g. SFT's
    `reference`, GRPO's `reward`). Rank 0 writes; returns the file's path."""
    path = log_dir / SAMPLES
    if dist.is_main() and samples:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as out:
            out.writelines(json.dumps({"step": step, **sample}, ensure_ascii=False) + "\n"
                           for sample in samples)
    return path


def announce(action: str, model: torch.nn.Module, length: str, device: torch.device, precision: str) -> None:
    """The line every run prints before its first step (rank 0): what it trains, for how long, on what."""
    if dist.is_main():
        trainable, threads = sum(p.numel() for p in model.parameters() if p.requires_grad), torch.get_num_threads()
        print(f"rmkit: {action} ({trainable:,} trainable parameters) for {length} on {device} with "
              f"{threads} thread{'' if threads == 1 else 's'}, {precision}", file=sys.stderr)


def summary(metrics: dict[str, float], endings: tuple[str, ...]) -> str:
    """`name value, ...` of the metrics whose names end with one of `endings` (a recipe's headline metrics)."""
    return ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k.endswith(endings))
