"""`rmkit dpo` at the edges of a run: killed with SIGKILL and resumed == uninterrupted (bitwise on CPU, one
thread), and a 2-process torchrun run (DDP, FSDP2, FSDP2 with LoRA) == one process with the same global batch.

Tolerances: the two runs add the same contributions in another order (per-rank sums, then an all-reduce),
so they agree to float32 rounding, which Adam can amplify on near-zero gradients: metrics to 1e-5 relative
(+1e-5 absolute: rewards are differences of sums near -200), final weights to 1e-5 absolute. Averaging instead
of summing gradients, or local instead of global counts, is off by a factor of 2 at the first step.
"""

import random
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from rmkit import cli
from tests.recipes.dpo_helpers import dpo_values, read_metrics, write_pairs
from tests.support.launch import CHILD_ENV, torchrun
from tests.support.runs import kill_at_step, logged_metrics

pytestmark = pytest.mark.slow
TIMING_KEYS = ("train/pairs_per_s", "train/tokens_per_s")


def write_config(path: Path, model: str, train: Path, val: Path, out: Path, **sections) -> Path:
    values = dpo_values(model, train, val, out, **sections)
    path.write_text(yaml.safe_dump(values))
    return path


def rmkit_dpo(capsys, *args) -> str:
    """`rmkit dpo ARGS` in this process; returns its stderr."""
    threads = torch.get_num_threads()
    try:
        assert cli.main(["dpo", *map(str, args)]) == 0, capsys.readouterr().err[-4000:]
    finally:
        torch.set_num_threads(threads)
    return capsys.readouterr().err


def metrics(out: Path) -> list[dict]:
    return logged_metrics(out, TIMING_KEYS)


STEPS = 14
RESUME = {"dpo": {"max_num_steps": STEPS, "max_num_epochs": 10, "val_period": 4, "val_at_start": True,
                  "log_period": 3},  # 3: logged windows straddle checkpoints
          "checkpointing": {"save_period": 4, "keep_top_k": 2}}


def test_sigkill_then_resume_matches_uninterrupted_run(tiny_policy, tmp_path, capsys):
    train, val = write_pairs(tmp_path / "train.jsonl", 12), write_pairs(tmp_path / "val.jsonl", 3, offset=40)
    base = tmp_path / "uninterrupted"
    rmkit_dpo(capsys, "--config", write_config(tmp_path / "a.yaml", tiny_policy, train, val, base, **RESUME))

    out = tmp_path / "run"
    config = write_config(tmp_path / "b.yaml", tiny_policy, train, val, out, **RESUME)
    kill_at = random.Random().randint(5, STEPS - 3)  # after the first checkpoint
    kill_at_step(["dpo", "--config", config], out, kill_at)

    err = rmkit_dpo(capsys, "--config", config, "--resume")
    assert "resuming from" in err and "read from" in err and "computed" not in err  # the cached reference pass
    a, b = load_file(out / "final" / "model.safetensors"), load_file(base / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert metrics(out) == metrics(base), f"killed at step >= {kill_at}"
    assert read_metrics(out / "logs" / "samples.jsonl") == read_metrics(base / "logs" / "samples.jsonl")


PARALLEL = {"ddp": {}, "fsdp2": {"dtensor_cfg": {"enabled": True}},
            "fsdp2_lora": {"dtensor_cfg": {"enabled": True}, "lora": {"enabled": True, "r": 4, "alpha": 8}}}


@pytest.mark.parametrize("parallel", PARALLEL)
def test_two_processes_match_one(tiny_policy, tmp_path, parallel):
    # 9 pairs in global batches of 4: the third batch holds one pair, so rank 1's share is empty for a step;
    # two epochs; 5 validation pairs: the ranks validate different numbers of pairs (2 and 1 micro-batches),
    # and the reference pass runs 5 and 4 micro-batches (under FSDP2, rank 1 adds a placeholder).
    train, val = write_pairs(tmp_path / "train.jsonl", 9), write_pairs(tmp_path / "val.jsonl", 5, offset=40)
    runs = {}
    for nproc, micro in ((1, 2), (2, 1)):
        out = tmp_path / f"run{nproc}"
        config = write_config(tmp_path / f"c{nproc}.yaml", tiny_policy, train, val, out,
                              dpo={"max_num_steps": 6, "max_num_epochs": 2, "val_period": 3, "val_at_start": True},
                              policy={"train_micro_batch_size": micro, "optimizer": {"lr": 3e-3}, **PARALLEL[parallel]})
        torchrun(["-m", "rmkit", "dpo", "--config", str(config)], CHILD_ENV, nproc=nproc)  # both sides on the CPU
        runs[nproc] = out
    one, two = metrics(runs[1]), metrics(runs[2])
    assert [r["step"] for r in one] == [r["step"] for r in two]  # rank 0 alone logged, once
    for a, b in zip(one, two):
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-5), (a["step"], key)
    w1, w2 = load_file(runs[1] / "final" / "model.safetensors"), load_file(runs[2] / "final" / "model.safetensors")
    for key in w1:
        torch.testing.assert_close(w2[key], w1[key], rtol=0, atol=1e-5)
