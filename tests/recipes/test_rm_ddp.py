"""`torchrun --nproc-per-node 2 -m rmkit train` (gloo, CPU) == one process with the same global batch.

The run crosses an epoch boundary, and its 9th global batch holds a single pair, so rank 1's share is
empty for a step (it joins the gradient all-reduce with a masked placeholder row).

Tolerances: the two runs add the same gradient contributions in a different order (per-rank sums, then
an all-reduce) and score validation rows in different batches, so they agree to float32 rounding,
which Adam's normalization can amplify on near-zero gradients over the steps: logged metrics to 1e-5
relative (plus 1e-6 absolute for means near zero), final weights to 1e-5 absolute (observed: 3e-6
relative and 1e-6 absolute). A mistake in the normalization (averaging instead of summing gradients,
local instead of global counts) is off by a factor of 2 and fails at the first step.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from rmkit import cli
from tests.support.launch import CHILD_ENV, torchrun
from tests.support.tiny import make_tiny_decoder, write_pairs

STEPS = 8


def write_config(tmp_path: Path, name: str, micro: int) -> Path:
    model = tmp_path / "model"
    if not model.exists():
        make_tiny_decoder(model)
        write_pairs(
            tmp_path / "train.jsonl", 65, seed=1
        )  # 8 global batches of 8 + one of 1 pair: rank 1 gets none
        write_pairs(tmp_path / "val.jsonl", 21, seed=2)  # odd: the ranks validate different numbers of pairs
    out = tmp_path / name
    config = {
        "rm": {"max_num_epochs": 2, "max_num_steps": STEPS + 2, "val_period": 4, "val_at_start": True,
               "seed": 5, "log_period": 1},
        "policy": {"model_name": str(model), "train_global_batch_size": 8, "train_micro_batch_size": micro,
                   "max_total_sequence_length": 32, "precision": "float32", "num_threads": 1,
                   "optimizer": {"lr": 3e-3}, "max_grad_norm": 1.0},
        "data": {"train_data_path": str(tmp_path / "train.jsonl"),
                 "val_data_paths": {"default": str(tmp_path / "val.jsonl")}},
        "checkpointing": {"checkpoint_dir": str(out), "save_period": 5, "keep_top_k": None},
        "logger": {"log_dir": str(out / "logs"), "tensorboard": False, "progress_bar": False, "plots": False},
    }  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def rmkit_torchrun(config: Path, *args: str) -> str:
    return torchrun(["-m", "rmkit", "train", "--config", str(config), *args], CHILD_ENV)


def assert_close_runs(out_a: Path, out_b: Path) -> None:
    a_records, b_records = records(out_a), records(out_b)
    assert [r["step"] for r in a_records] == [r["step"] for r in b_records]  # rank 0 alone logged, once
    for a, b in zip(a_records, b_records):
        assert a.keys() == b.keys()
        for key in a:
            if a[key] is None:  # a metric with no value (regression's train/acc)
                assert b[key] is None, (a["step"], key)
                continue
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (a["step"], key)
    w1, w2 = (
        load_file(out_a / "final" / "model.safetensors"),
        load_file(out_b / "final" / "model.safetensors"),
    )
    assert w1.keys() == w2.keys()
    for key in w1:
        torch.testing.assert_close(w2[key], w1[key], rtol=0, atol=1e-5)


def records(out: Path) -> list[dict]:
    lines = (out / "logs" / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.endswith("_per_s")} for line in lines]


@pytest.mark.slow  # ~25 s on a quiet 2-core machine (2 torchrun launches, each importing transformers twice)
def test_two_gloo_processes_equal_one_process(tmp_path):
    single = write_config(tmp_path, "single", micro=4)
    double = write_config(tmp_path, "ddp", micro=2)  # per rank: 4 pairs of the global 8, in 2 micro-batches
    threads = torch.get_num_threads()
    try:  # the single-process reference runs in this process (no second round of imports)
        assert cli.main(["train", "--config", str(single)]) == 0
    finally:
        torch.set_num_threads(threads)
    err = rmkit_torchrun(double)
    assert_close_runs(tmp_path / "single", tmp_path / "ddp")
    val = [r for r in records(tmp_path / "ddp") if "validation-default/num_pairs" in r]
    assert val and all(r["validation-default/num_pairs"] == 21 for r in val)  # gathered from both ranks
    assert sorted(p.name for p in (tmp_path / "ddp").glob("step_*")) == ["step_10", "step_5"]
    assert err.count("rmkit: training") == 1, "only rank 0 prints"

    # The single process's step-5 checkpoint, resumed by 2 processes, ends where the single run did.
    mixed = write_config(tmp_path, "mixed", micro=2)
    (tmp_path / "mixed").mkdir()
    shutil.copytree(tmp_path / "single" / "step_5", tmp_path / "mixed" / "step_5")
    shutil.copytree(tmp_path / "single" / "logs", tmp_path / "mixed" / "logs")
    err = rmkit_torchrun(mixed, "--resume")
    assert "saved by 1 process(es), this run has 2" in err and err.count("resuming from") == 1
    assert_close_runs(tmp_path / "single", tmp_path / "mixed")
