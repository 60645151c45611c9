"""`rmkit train` killed with SIGKILL mid-run and resumed == the same run uninterrupted (bitwise on CPU).

Also: a checkpoint truncated on disk is skipped on resume with a warning, and top-k retention on a real run.
The killed run is a real subprocess; the reference and resumed runs call the same CLI entry point in
this process (it saves the ~10 s of imports per run), with the same single thread.
"""

import json
import random
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from rmkit import cli
from tests.support.runs import kill_at_step, logged_metrics
from tests.support.tiny import make_tiny_decoder, write_pairs

STEPS, SAVE_PERIOD, VAL_PERIOD = 30, 5, 5
TIMING_KEYS = ("train/pairs_per_s", "train/tokens_per_s")  # wall-clock numbers differ between runs


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("assets")
    model = make_tiny_decoder(root / "model")
    return model, write_pairs(root / "train.jsonl", 96, seed=1), write_pairs(root / "val.jsonl", 24, seed=2)


def write_config(path: Path, assets, out: Path, **checkpointing) -> Path:
    model, train, val = assets
    config = {
        "rm": {"max_num_epochs": 4, "max_num_steps": STEPS, "val_period": VAL_PERIOD, "val_at_start": False,
               "seed": 5, "log_period": 3},  # 3: logged windows straddle checkpoints
        "policy": {"model_name": str(model), "train_global_batch_size": 8, "train_micro_batch_size": 4,
                   "max_total_sequence_length": 32, "precision": "float32", "num_threads": 1,
                   "optimizer": {"lr": 3e-3}, "scheduler": {"name": "cosine", "warmup_steps": 3}},
        "data": {"train_data_path": str(train), "val_data_paths": {"default": str(val)}},
        "checkpointing": {"checkpoint_dir": str(out), "save_period": SAVE_PERIOD, "keep_top_k": 2, **checkpointing},
        "logger": {"log_dir": str(out / "logs"), "tensorboard": False, "progress_bar": False, "plots": False},
    }  # fmt: skip
    path.write_text(yaml.safe_dump(config))
    return path


def rmkit_train(capsys, *args) -> str:
    """`rmkit train ARGS` in this process; returns its stderr."""
    threads = torch.get_num_threads()
    try:
        assert cli.main(["train", *map(str, args)]) == 0, capsys.readouterr().err[-4000:]
    finally:
        torch.set_num_threads(threads)
    return capsys.readouterr().err


def metrics(out: Path) -> list[dict]:
    return logged_metrics(out, TIMING_KEYS)


def weights(directory: Path) -> dict:
    return load_file(directory / "model.safetensors")


def assert_bitwise_equal(a: dict, b: dict):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.fixture
def uninterrupted(assets, tmp_path, capsys):
    out = tmp_path / "uninterrupted"
    rmkit_train(capsys, "--config", write_config(tmp_path / "uninterrupted.yaml", assets, out))
    return out


def test_sigkill_then_resume_matches_uninterrupted_run(assets, uninterrupted, tmp_path, capsys):
    out = tmp_path / "run"
    config = write_config(tmp_path / "rm.yaml", assets, out)
    kill_at = random.Random().randint(SAVE_PERIOD + 1, STEPS - 6)  # after the first checkpoint
    kill_at_step(["train", "--config", config], out, kill_at)

    err = rmkit_train(capsys, "--config", config, "--resume")
    assert "resum" in err.lower(), err[-2000:]
    assert_bitwise_equal(weights(out / "final"), weights(uninterrupted / "final"))
    assert_bitwise_equal(weights(out / f"step_{STEPS}"), weights(uninterrupted / f"step_{STEPS}"))
    assert metrics(out) == metrics(uninterrupted), f"killed at step >= {kill_at}"


def test_truncated_checkpoint_is_skipped_on_resume(assets, uninterrupted, tmp_path, capsys):
    # Resume from a copy of the finished run whose newest checkpoint is damaged: the one before is used.
    import shutil

    out = tmp_path / "run"
    shutil.copytree(uninterrupted, out)
    shutil.rmtree(out / "final")
    steps = sorted(int(p.name.split("_")[1]) for p in out.glob("step_*"))
    newest = out / f"step_{steps[-1]}" / "model.safetensors"
    with open(newest, "r+b") as f:
        f.truncate(newest.stat().st_size - 100)
    config = write_config(tmp_path / "rm.yaml", assets, out, resume="auto")
    err = rmkit_train(capsys, "--config", config)
    assert f"step_{steps[-1]} (step {steps[-1]}) is unusable" in err and "truncated" in err
    assert f"resuming from {out / f'step_{steps[-2]}'}" in err
    assert_bitwise_equal(weights(out / "final"), weights(uninterrupted / "final"))


def test_top_k_retention_on_a_real_run(uninterrupted):
    kept = sorted(int(p.name.split("_")[1]) for p in uninterrupted.glob("step_*"))
    assert STEPS in kept and len(kept) <= 3
    losses = {}
    for step in range(SAVE_PERIOD, STEPS + 1, SAVE_PERIOD):
        record = [r for r in metrics(uninterrupted) if r["step"] == step and "validation-default/loss" in r]
        losses[step] = record[0]["validation-default/loss"]
    best_two = sorted(losses, key=lambda s: (losses[s], -s))[:2]
    assert set(kept) == set(best_two) | {STEPS}
    saved = json.loads((uninterrupted / f"step_{STEPS}" / "metrics.json").read_text())
    assert saved["val:validation-default_loss"] == losses[STEPS]


def test_resume_of_a_finished_run_changes_nothing(assets, uninterrupted, tmp_path, capsys):
    # Killed after its last checkpoint (during export): resuming re-validates and re-exports, and the
    # log still reads as one run (the final validation is not logged twice).
    import shutil

    out = tmp_path / "run"
    shutil.copytree(uninterrupted, out)
    shutil.rmtree(out / "final")
    err = rmkit_train(capsys, "--config", write_config(tmp_path / "rm.yaml", assets, out), "--resume")
    assert f"resuming from {out / f'step_{STEPS}'}" in err
    assert metrics(out) == metrics(uninterrupted)
    assert_bitwise_equal(weights(out / "final"), weights(uninterrupted / "final"))
