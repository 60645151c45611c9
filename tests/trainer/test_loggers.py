"""W&B (offline) and MLflow (local file store) backends; guarded imports; a clear message when missing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rmkit.config import MlflowConfig, WandbConfig
from rmkit.errors import ConfigError
from rmkit.trainer.logging.trackers import MlflowLogger, build_loggers

REPO_ROOT = Path(__file__).resolve().parents[2]
METRICS = [
    ({"train/loss": 0.69, "train/acc": 0.5, "note": "text is skipped"}, 1),
    ({"train/loss": 0.41, "validation-default/acc": 0.75, "val:validation-default_loss": 0.52}, 2),
]


def test_nothing_enabled_imports_nothing():
    code = (
        "import sys; from rmkit.trainer.logging.trackers import build_loggers;"
        "assert build_loggers(None, {'enabled': False}, '.') == [];"
        "assert 'wandb' not in sys.modules and 'mlflow' not in sys.modules"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)


@pytest.mark.parametrize(
    "backend,key", [("wandb", "logger.wandb.enabled"), ("mlflow", "logger.mlflow.enabled")]
)
def test_enabled_but_not_installed_names_the_extra(monkeypatch, tmp_path, backend, key):
    monkeypatch.setitem(sys.modules, backend, None)  # makes `import backend` raise ImportError
    with pytest.raises(ConfigError, match=rf"pip install rmkit\[{backend}\]") as err:
        build_loggers(**{backend: {"enabled": True}}, log_dir=tmp_path)
    assert err.value.key == key


def test_bad_wandb_mode_is_a_config_error():
    with pytest.raises(ConfigError, match="logger.wandb.mode"):
        WandbConfig(mode="sometimes")


def test_mlflow_file_store_round_trip(tmp_path):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install rmkit[mlflow])")
    from mlflow.tracking import MlflowClient

    config = {"policy": {"optimizer": {"lr": 1e-5}}, "rm": {"seed": 42}}
    cfg = MlflowConfig(
        enabled=True, tracking_uri=f"file:{tmp_path / 'store'}", experiment_name="exp", run_name="r"
    )
    (logger,) = build_loggers(mlflow=cfg, log_dir=tmp_path, config=config)
    assert isinstance(logger, MlflowLogger)
    for metrics, step in METRICS:
        logger.log(metrics, step)
    logger.close()

    client = MlflowClient(tracking_uri=cfg.tracking_uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "r"
    assert run.data.params == {"policy.optimizer.lr": "1e-05", "rm.seed": "42"}
    history = [(m.step, m.value) for m in client.get_metric_history(logger.run_id, "train/loss")]
    assert history == [(1, 0.69), (2, 0.41)]
    assert run.data.metrics["val:validation-default_loss"] == 0.52
    assert "note" not in run.data.metrics


def test_mlflow_default_store_is_under_log_dir(tmp_path):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install rmkit[mlflow])")
    (logger,) = build_loggers(mlflow={"enabled": True}, log_dir=tmp_path)
    logger.log({"x": 1.0}, 0)
    logger.close()
    assert logger.tracking_uri == f"file:{tmp_path.resolve() / 'mlruns'}"
    assert (tmp_path / "mlruns").is_dir()


def test_wandb_offline_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install rmkit[wandb])")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_API_KEY", "")  # offline must not need a login
    cfg = WandbConfig(enabled=True, project="rmkit-test", name="offline-run", mode="offline")
    (logger,) = build_loggers(wandb=cfg, log_dir=tmp_path, config={"rm": {"seed": 42}})
    for metrics, step in METRICS:
        logger.log(metrics, step)
    logger.close()
    run_files = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 1 and run_files[0].stat().st_size > 0
    assert logger.run_dir.parent == tmp_path / "wandb"
