"""A real `rmkit train` run sends the same metrics to MLflow and W&B (offline) as to metrics.jsonl."""

import json

import pytest
import yaml

from tests.recipes.test_rm_resume import assets, rmkit_train, write_config  # noqa: F401 (assets: fixture)


@pytest.mark.slow  # ~10 s on a quiet machine, mostly W&B's service start; the backends' unit tests are fast
def test_train_logs_to_mlflow_and_wandb(assets, tmp_path, capsys, monkeypatch):  # noqa: F811
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install rmkit[mlflow])")
    pytest.importorskip("wandb", reason="wandb is not installed (pip install rmkit[wandb])")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    config = write_config(tmp_path / "rm.yaml", assets, out)
    tree = yaml.safe_load(config.read_text())
    tree["rm"]["max_num_steps"] = 6
    tree["logger"]["mlflow"] = {
        "enabled": True,
        "tracking_uri": f"file:{tmp_path / 'mlruns'}",
        "run_name": "t",
    }
    tree["logger"]["wandb"] = {"enabled": True, "mode": "offline", "name": "t"}
    config.write_text(yaml.safe_dump(tree))
    rmkit_train(capsys, "--config", config)

    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    losses = [(r["step"], r["train/loss"]) for r in records if "train/loss" in r]
    client = MlflowClient(tracking_uri=tree["logger"]["mlflow"]["tracking_uri"])
    (run,) = client.search_runs([client.get_experiment_by_name("rmkit").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["rm.seed"] == "5"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in history] == [step for step, _ in losses]
    assert [m.value for m in history] == pytest.approx([loss for _, loss in losses], rel=1e-12)
    assert "validation-default/acc" in run.data.metrics
    assert len(list((out / "logs" / "wandb").glob("offline-run-*/run-*.wandb"))) == 1
