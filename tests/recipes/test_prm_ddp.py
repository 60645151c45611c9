"""`torchrun --nproc-per-node 2 -m rmkit train --config <prm>` (gloo, CPU), under DDP and under FSDP2
(`policy.dtensor_cfg.enabled`), == one process with the same global batch, for the process-reward-model recipe: the loss is summed over labelled steps and divided by the global batch's
labelled-step count (all-reduced), so two ranks compute the gradient of the same batch as one process does.

33 solutions in global batches of 8: the 5th batch holds one solution, so rank 1's share is empty for that step (it
joins the all-reduce with a placeholder row that carries no label). Tolerances as tests/recipes/test_rm_ddp.py
explains: float32 rounding of a different summation order; a normalization mistake (local instead of global step
counts, averaging instead of summing gradients) is off by a factor and fails at the first step.
"""

import json
from pathlib import Path

import pytest
import torch
import yaml

from rmkit import cli
from tests.recipes.test_rm_ddp import assert_close_runs
from tests.support.launch import CHILD_ENV, torchrun


def write_solutions(path: Path, n: int) -> Path:
    rows = []
    for i in range(n):
        good = i % 3 != 0
        steps = [f"Add {i} and {i}.", f"{i} + {i} = {2 * i if good else 2 * i + 1}."] + (["Done."] if i % 2 else [])
        rows.append({"prompt": f"What is {i} + {i}?", "completions": steps,
                     "labels": [True, good] + ([good] if i % 2 else [])})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_config(tmp_path: Path, model: str, name: str, micro: int, fsdp: bool = False) -> Path:
    if not (tmp_path / "train.jsonl").exists():
        write_solutions(tmp_path / "train.jsonl", 33)
        write_solutions(tmp_path / "val.jsonl", 7)
    out = tmp_path / name
    config = {
        "prm": {"max_num_epochs": 1, "max_num_steps": 5, "val_period": 2, "val_at_start": True, "seed": 5,
                "log_period": 1, "step_separator": "\n"},
        "policy": {"model_name": model, "train_global_batch_size": 8, "train_micro_batch_size": micro,
                   "max_total_sequence_length": 64, "precision": "float32", "num_threads": 1,
                   "optimizer": {"lr": 3e-3}, "max_grad_norm": 1.0, "dtensor_cfg": {"enabled": fsdp}},
        "data": {"train_data_path": str(tmp_path / "train.jsonl"),
                 "val_data_paths": {"default": str(tmp_path / "val.jsonl")}},
        "checkpointing": {"checkpoint_dir": str(out), "save_period": 10, "keep_top_k": None,
                          "metric_name": "val:validation-default_loss"},
        "logger": {"log_dir": str(out / "logs"), "tensorboard": False, "progress_bar": False, "plots": False},
    }  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow  # ~30 s on a quiet 2-core machine (a torchrun launch of 2 processes)
@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp2"])
def test_two_gloo_processes_equal_one_process(tiny_reward_model, tmp_path, fsdp):
    single = write_config(tmp_path, tiny_reward_model, "single", micro=4)
    double = write_config(tmp_path, tiny_reward_model, "ddp", micro=2, fsdp=fsdp)  # per rank: 4 of 8, 2 micro-batches
    threads = torch.get_num_threads()
    try:
        assert cli.main(["train", "--config", str(single)]) == 0
    finally:
        torch.set_num_threads(threads)
    err = torchrun(["-m", "rmkit", "train", "--config", str(double)], CHILD_ENV)
    assert_close_runs(tmp_path / "single", tmp_path / "ddp")
    lines = [json.loads(line) for line in (tmp_path / "ddp" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert any("validation-default/num_steps" in r for r in lines) and err.count("rmkit: training") == 1
