"""Sharded (FSDP2) checkpoints on a real run: `torchrun --nproc-per-node 2 -m rmkit train` with
`policy.dtensor_cfg.enabled` (gloo, CPU) killed with SIGKILL and resumed, resumed by a different number of
processes, and resumed past a damaged shard.

Tolerances: a run resumed by the same 2 processes repeats the uninterrupted run's arithmetic exactly, so
its final weights and logged metrics are compared bitwise. A run resumed by 1 process (2 -> 1), or by 2
from a single process's checkpoint (1 -> 2), adds the same gradient contributions in a different order
after the resume (one process's sum against a reduce-scatter of two), so it agrees to float32 rounding:
`assert_close_runs`, metrics to 1e-5 relative and weights to 1e-5 absolute, as in `test_train_fsdp.py`
(observed: 7.5e-9). A resume that lost the optimizer state or the sampler position is off by ~lr = 3e-3.
"""

import random
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from rmkit import cli
from rmkit.trainer.checkpointing.files import read_manifest
from tests.recipes.test_rm_ddp import assert_close_runs
from tests.recipes.test_rm_resume import assert_bitwise_equal, metrics, rmkit_train, weights
from tests.support.launch import CHILD_ENV, kill_all, start_torchrun, torchrun
from tests.support.runs import wait_for_step
from tests.support.tiny import make_tiny_decoder, write_pairs

STEPS, SAVE_PERIOD = 8, 2  # 48 pairs: 6 steps of 8 per epoch, so the run crosses an epoch boundary


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("assets")
    model = make_tiny_decoder(root / "model")
    return model, write_pairs(root / "train.jsonl", 48, seed=1), write_pairs(root / "val.jsonl", 12, seed=2)


def write_config(path: Path, assets, out: Path, micro: int = 2, **checkpointing) -> Path:
    model, train, val = assets
    config = {
        "rm": {"max_num_epochs": 3, "max_num_steps": STEPS, "val_period": SAVE_PERIOD, "val_at_start": False,
               "seed": 5, "log_period": 1},
        "policy": {"model_name": str(model), "train_global_batch_size": 8, "train_micro_batch_size": micro,
                   "max_total_sequence_length": 32, "precision": "float32", "num_threads": 1,
                   "optimizer": {"lr": 3e-3}, "scheduler": {"name": "cosine", "warmup_steps": 2},
                   "dtensor_cfg": {"enabled": True}},
        "data": {"train_data_path": str(train), "val_data_paths": {"default": str(val)}},
        "checkpointing": {"checkpoint_dir": str(out), "save_period": SAVE_PERIOD, "keep_top_k": 2, **checkpointing},
        "logger": {"log_dir": str(out / "logs"), "tensorboard": False, "progress_bar": False, "plots": False},
    }  # fmt: skip
    path.write_text(yaml.safe_dump(config))
    return path


def train_two(config: Path, *args: str) -> str:
    return torchrun(["-m", "rmkit", "train", "--config", str(config), *args], CHILD_ENV)


def steps_kept(out: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in out.glob("step_*"))


def resumable_copy(run: Path, out: Path, keep: int) -> Path:
    """`run` without its final model and every checkpoint but `step_<keep>`: `--resume` continues from there."""
    shutil.copytree(run, out)
    shutil.rmtree(out / "final")
    for step in steps_kept(out):
        if step != keep:
            shutil.rmtree(out / f"step_{step}")
    return out


@pytest.fixture(scope="module")
def two_processes(assets, tmp_path_factory):
    """An uninterrupted sharded 2-process run."""
    root = tmp_path_factory.mktemp("two")
    train_two(write_config(root / "rm.yaml", assets, root / "run"))
    return root / "run"


@pytest.fixture(scope="module")
def one_process(assets, tmp_path_factory):
    """The same run in one process (no torchrun: `dtensor_cfg.enabled` trains unsharded, full checkpoints)."""
    root = tmp_path_factory.mktemp("one")
    threads = torch.get_num_threads()
    try:  # in this process, as `rmkit_train` does (a module fixture cannot capture output)
        assert cli.main(["train", "--config", str(write_config(root / "rm.yaml", assets, root / "run", micro=4))]) == 0
    finally:
        torch.set_num_threads(threads)
    return root / "run"


@pytest.mark.slow  # ~60 s on a loaded 2-core machine (3 torchrun launches)
def test_sigkill_then_resume_sharded_matches_uninterrupted_run(assets, two_processes, tmp_path):
    out = tmp_path / "run"
    config = write_config(tmp_path / "rm.yaml", assets, out)
    kill_at = random.Random().randint(SAVE_PERIOD + 1, STEPS - 2)  # after the first checkpoint
    proc = start_torchrun(["-m", "rmkit", "train", "--config", str(config)], CHILD_ENV)
    wait_for_step(proc, out, kill_at)
    kill_all(proc)  # the launcher and both ranks, wherever they are (in a save included)
    proc.communicate(timeout=60)
    assert not (out / "final").exists(), "the run finished before it was killed"
    assert all(read_manifest(out / f"step_{s}")["layout"] == "sharded" for s in steps_kept(out))

    err = train_two(config, "--resume")
    assert err.count("resuming from") == 1, err[-2000:]
    assert_bitwise_equal(weights(out / "final"), weights(two_processes / "final"))
    assert metrics(out) == metrics(two_processes), f"killed at step >= {kill_at}"
    assert steps_kept(out) == steps_kept(two_processes)


@pytest.mark.slow  # shares the 2-process run
def test_top_k_retention_of_sharded_checkpoints(two_processes):
    kept = steps_kept(two_processes)
    assert STEPS in kept and len(kept) <= 3 and not list(two_processes.glob(".tmp-*"))
    losses = {r["step"]: r["validation-default/loss"] for r in metrics(two_processes) if "validation-default/loss" in r}
    assert set(kept) == set(sorted(losses, key=lambda s: (losses[s], -s))[:2]) | {STEPS}
    manifest = read_manifest(two_processes / f"step_{STEPS}")
    assert manifest["world_size"] == 2 and {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= manifest["files"].keys()
    state = torch.load(two_processes / f"step_{STEPS}" / "trainer_state.pt", weights_only=True)
    assert len(state["rng"]) == 2, "every rank's RNG, in rank order"


@pytest.mark.slow  # ~10 s (in process)
def test_resume_two_processes_checkpoint_on_one(assets, two_processes, tmp_path, capsys):
    middle = steps_kept(two_processes)[0]
    out = resumable_copy(two_processes, tmp_path / "run", keep=middle)
    err = rmkit_train(capsys, "--config", write_config(tmp_path / "rm.yaml", assets, out, micro=4), "--resume")
    assert f"resuming from {out / f'step_{middle}'}" in err and "saved by 2 process(es), this run has 1" in err
    assert_close_runs(two_processes, out)
    assert read_manifest(out / f"step_{STEPS}")["layout"] == "full"  # one process: unsharded, a model directory


@pytest.mark.slow  # ~25 s (one torchrun launch)
def test_resume_one_process_checkpoint_on_two(assets, one_process, tmp_path):
    middle = steps_kept(one_process)[0]
    out = resumable_copy(one_process, tmp_path / "run", keep=middle)
    err = train_two(write_config(tmp_path / "rm.yaml", assets, out), "--resume")
    assert "saved by 1 process(es), this run has 2" in err and err.count("resuming from") == 1
    assert_close_runs(one_process, out)
    assert read_manifest(out / f"step_{STEPS}")["layout"] == "sharded"


@pytest.mark.slow  # ~25 s (one torchrun launch)
def test_truncated_shard_is_skipped_on_resume(assets, two_processes, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(two_processes, out)
    shutil.rmtree(out / "final")
    newest, previous = steps_kept(out)[-1], steps_kept(out)[-2]
    shard = out / f"step_{newest}" / "__1_0.distcp"
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 100)
    err = train_two(write_config(tmp_path / "rm.yaml", assets, out), "--resume")
    assert f"step_{newest} (step {newest}) is unusable: __1_0.distcp has" in err and "truncated" in err
    assert f"resuming from {out / f'step_{previous}'}" in err
    assert_bitwise_equal(weights(out / "final"), weights(two_processes / "final"))
