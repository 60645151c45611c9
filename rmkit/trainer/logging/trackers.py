"""Experiment-tracker backends: Weights & Biases and MLflow, each imported only when enabled.

metrics.jsonl and TensorBoard live in `rmkit.trainer.logging.run_logger`; these two sit next to them with the same
small interface, `log(metrics, step)` and `close()`, and are built by `build_loggers` on rank 0 only.

    logger:
      wandb:  {enabled: true, project: rmkit, mode: offline}      # offline needs no network or login
      mlflow: {enabled: true, tracking_uri: file:./mlruns}         # a local file store
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
from pathlib import Path
from typing import Protocol

from rmkit.config import MlflowConfig, WandbConfig
from rmkit.errors import ConfigError


class TrackerBackend(Protocol):
    """What `RunLogger` forwards every logged record to (W&B, MLflow)."""

    def log(self, metrics: dict, step: int) -> None: ...

    def close(self) -> None: ...


def _numeric(metrics: dict) -> dict[str, float]:
    """The finite-or-not numbers among `metrics` (strings such as a checkpoint path are left out)."""
    out = {}
    for key, value in metrics.items():
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        out[str(key)] = float(value)
    return out


def _import(module: str, extra: str, key: str):
    try:
        return __import__(module)
    except ImportError:
        raise ConfigError(
            key, f"is enabled but the `{module}` package is not installed; pip install rmkit[{extra}]"
        ) from None


class WandbLogger:
    """Metrics to a Weights & Biases run; `config` (the resolved run config) is attached to the run."""

    def __init__(self, cfg: WandbConfig, log_dir: str | Path, config: dict | None = None):
        wandb = _import("wandb", "wandb", "logger.wandb.enabled")
        run_dir = Path(cfg.dir or log_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        kwargs = {"mode": cfg.mode} if cfg.mode else {}
        self._run = wandb.init(
            project=cfg.project,
            name=cfg.name,
            entity=cfg.entity,
            dir=str(run_dir),
            tags=list(cfg.tags) or None,
            config=config or {},
            **kwargs,
        )

    @property
    def run_dir(self) -> Path:
        return Path(self._run.dir).parent

    def log(self, metrics: dict, step: int) -> None:
        values = _numeric(metrics)
        if values:
            self._run.log(values, step=step)

    def close(self) -> None:
        self._run.finish()


# MLflow metric names allow letters, digits, `_ - . / : ` and spaces.
_MLFLOW_BAD = re.compile(r"[^A-Za-z0-9_\-./: ]")


class MlflowLogger:
    """Metrics to an MLflow run in `tracking_uri`; the config's leaves become run parameters."""

    def __init__(self, cfg: MlflowConfig, log_dir: str | Path, config: dict | None = None):
        mlflow = _import("mlflow", "mlflow", "logger.mlflow.enabled")
        uri = cfg.tracking_uri or f"file:{Path(log_dir).resolve() / 'mlruns'}"
        if uri.startswith("file:"):
            # MLflow >= 3.x refuses its file store unless opted in; naming a file: URI is that opt-in.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._client = mlflow.tracking.MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name(cfg.experiment_name)
        experiment_id = (
            experiment.experiment_id if experiment else self._client.create_experiment(cfg.experiment_name)
        )
        self._run_id = self._client.create_run(experiment_id, run_name=cfg.run_name).info.run_id
        self.tracking_uri = uri
        params = _flatten(config or {})
        entities = mlflow.entities
        batch = [entities.Param(k, str(v)[:6000]) for k, v in params.items()]
        for start in range(0, len(batch), 100):  # MLflow accepts at most 100 params per call
            self._client.log_batch(self._run_id, params=batch[start : start + 100])
        self._metric = entities.Metric

    @property
    def run_id(self) -> str:
        return self._run_id

    def log(self, metrics: dict, step: int) -> None:
        now = _now_ms()
        batch = [
            self._metric(_MLFLOW_BAD.sub("_", k), v if math.isfinite(v) else float("nan"), now, step)
            for k, v in _numeric(metrics).items()
        ]
        if batch:
            self._client.log_batch(self._run_id, metrics=batch)

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _as_config(value, cls):
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    return cls(**value)


def build_loggers(wandb=None, mlflow=None, log_dir: str | Path = ".", config: dict | None = None) -> list:
    """The enabled backends among `wandb` / `mlflow` (dataclass, dict or None); [] when none is.

    Call on rank 0 only. Raises `ConfigError` naming the key when a backend is enabled but its package
    is missing.
    """
    wandb_cfg, mlflow_cfg = _as_config(wandb, WandbConfig), _as_config(mlflow, MlflowConfig)
    loggers: list = []
    if wandb_cfg.enabled:
        loggers.append(WandbLogger(wandb_cfg, log_dir, config))
    if mlflow_cfg.enabled:
        loggers.append(MlflowLogger(mlflow_cfg, log_dir, config))
    return loggers
