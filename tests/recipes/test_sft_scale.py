"""`rmkit sft` killed with SIGKILL and resumed == uninterrupted (bitwise on CPU, one thread); a 2-process
torchrun DDP run, and a 2-process FSDP2 run, == one process with the same global batch.

DDP tolerance: the ranks sum their gradient shares in another order than one process does (then an
all-reduce), so the runs agree to float32 rounding that Adam can amplify on near-zero gradients: logged
losses to 1e-4 relative, final weights to 1e-5 absolute (as tests/recipes/test_rm_ddp.py). Averaging instead of
summing gradients, or local instead of global token counts, is off by a factor of ~2 at the first step.
"""

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from rmkit import cli
from tests.support.launch import CHILD_ENV, torchrun
from tests.support.runs import kill_at_step, logged_metrics

STEPS, SAVE_PERIOD = 16, 4
TIMING = ("train/tokens_per_s", "train/sequences_per_s", "validation-held_out/tokens_per_s")


def conversation(i: int) -> dict:
    turns = [{"role": "user", "content": f"What is {i} plus {i}?"}, {"role": "assistant", "content": f"It is {2 * i}."}]
    if i % 3 == 0:
        turns += [{"role": "user", "content": "And doubled?"}, {"role": "assistant", "content": f"{4 * i}, " * (i % 5)}]
    return {"messages": turns}


def write_config(tmp_path: Path, tiny_policy: str, name: str, micro: int = 2, **sft) -> Path:
    for file, ids in (("train.jsonl", range(33)), ("val.jsonl", range(100, 107))):
        (tmp_path / file).write_text("".join(json.dumps(conversation(i)) + "\n" for i in ids))
    out = tmp_path / name
    config = {
        "sft": {"max_num_epochs": 4, "max_num_steps": STEPS, "val_period": 4, "seed": 5, "log_period": 3,
                "num_sample_generations": 1, "sample_max_new_tokens": 4, **sft},
        "policy": {"model_name": tiny_policy, "train_global_batch_size": 8, "train_micro_batch_size": micro,
                   "max_total_sequence_length": 64, "num_threads": 1, "optimizer": {"lr": 3e-3},
                   "scheduler": {"warmup_steps": 2}},
        "data": {"train_data_path": str(tmp_path / "train.jsonl"), "val_data_paths": {"held_out": str(tmp_path / "val.jsonl")}},
        "checkpointing": {"checkpoint_dir": str(out), "save_period": SAVE_PERIOD, "keep_top_k": 2},
        "logger": {"log_dir": str(out / "logs"), "tensorboard": False, "progress_bar": False, "plots": False},
    }  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def rmkit_sft(capsys, *args) -> str:
    threads = torch.get_num_threads()
    try:
        assert cli.main(["sft", *map(str, args)]) == 0, capsys.readouterr().err[-4000:]
    finally:
        torch.set_num_threads(threads)
    return capsys.readouterr().err


def metrics(out: Path) -> list[dict]:
    return logged_metrics(out, TIMING)


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted_run(tiny_policy, tmp_path, capsys):
    reference = tmp_path / "reference"
    rmkit_sft(capsys, "--config", write_config(tmp_path, tiny_policy, "reference"))
    out = tmp_path / "run"
    config = write_config(tmp_path, tiny_policy, "run")
    kill_at = random.Random().randint(SAVE_PERIOD + 1, STEPS - 3)
    kill_at_step(["sft", "--config", config], out, kill_at)

    err = rmkit_sft(capsys, "--config", config, "--resume")
    assert "resuming" in err, err[-2000:]
    a, b = load_file(out / "final/model.safetensors"), load_file(reference / "final/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert metrics(out) == metrics(reference), f"killed at step >= {kill_at}"
    samples = [(s["step"], s["completion"]) for s in map(json.loads, (out / "logs/samples.jsonl").read_text().splitlines())]
    assert samples == [(s["step"], s["completion"])
                       for s in map(json.loads, (reference / "logs/samples.jsonl").read_text().splitlines())]


@pytest.mark.slow
@pytest.mark.parametrize("packing", [False, True])
def test_torchrun_two_processes_equal_one(tiny_policy, tmp_path, capsys, packing):
    one = write_config(tmp_path, tiny_policy, "one", micro=4, sequence_packing=packing)
    two = write_config(tmp_path, tiny_policy, "two", micro=2, sequence_packing=packing)  # 4 per rank: 2 x 2
    rmkit_sft(capsys, "--config", one, "checkpointing.enabled=false", "sft.max_num_steps=6")
    err = torchrun(["-m", "rmkit", "sft", "--config", str(two), "checkpointing.enabled=false", "sft.max_num_steps=6"],
                   CHILD_ENV)
    # Rank 0 alone reports: a validation mid-run (val_period 4) and the summary after the process group is gone.
    assert err.count("rmkit: step 4: ") == 1 and err.count("rmkit: trained 6 steps") == 1, err[-3000:]
    m1, m2 = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert [sorted(r) for r in m1] == [sorted(r) for r in m2]
    for r1, r2 in zip(m1, m2):
        for key in r1:
            assert r2[key] == pytest.approx(r1[key], rel=1e-4, abs=1e-6), (key, r1["step"])
    w1, w2 = (load_file(tmp_path / name / "final/model.safetensors") for name in ("one", "two"))
    for key in w1:
        torch.testing.assert_close(w2[key], w1[key], rtol=0, atol=1e-5)


def assert_close(one: Path, two: Path) -> None:
    """Logged metrics to 1e-4 relative and final weights to 1e-5 absolute (the DDP tolerances above)."""
    m1, m2 = metrics(one), metrics(two)
    assert [sorted(r) for r in m1] == [sorted(r) for r in m2]
    for r1, r2 in zip(m1, m2):
        for key in r1:
            assert r2[key] == pytest.approx(r1[key], rel=1e-4, abs=1e-6), (key, r1["step"])
    w1, w2 = (load_file(out / "final/model.safetensors") for out in (one, two))
    assert w1.keys() == w2.keys()
    for key in w1:
        torch.testing.assert_close(w2[key], w1[key], rtol=0, atol=1e-5)


@pytest.mark.slow  # ~40 s: one torchrun launch, two in-process runs
@pytest.mark.parametrize("options", [[], ["sft.sequence_packing=true", "policy.lora.enabled=true"]],
                         ids=["padded", "packed_lora"])
def test_fsdp2_two_processes_equal_one_and_resume_on_one(tiny_policy, tmp_path, capsys, options):
    """FSDP2 (2 gloo processes, every block sharded, tied embeddings in the root) == one process; its sharded
    checkpoint resumed by one process (DCP reshards) ends where the 2-process run ended. Steps 5 and 10 hold
    one demonstration (33 per epoch): rank 1's share is empty and runs a placeholder micro-batch; the 7
    validation demonstrations split 4 / 3."""
    fsdp = ["policy.dtensor_cfg.enabled=true", "sft.max_num_steps=8", *options]
    one = write_config(tmp_path, tiny_policy, "one", micro=4)
    two = write_config(tmp_path, tiny_policy, "two", micro=2)  # 4 per rank: 2 micro-batches of 2
    rmkit_sft(capsys, "--config", one, "checkpointing.enabled=false", *fsdp)  # unsharded: no process group
    torchrun(["-m", "rmkit", "sft", "--config", str(two), *fsdp], CHILD_ENV)
    assert_close(tmp_path / "one", tmp_path / "two")
    assert json.loads((tmp_path / "two/step_4/manifest.json").read_text())["layout"] == "sharded"
    samples = (tmp_path / "two/logs/samples.jsonl").read_text().splitlines()
    assert [json.loads(s)["step"] for s in samples] == [0, 4, 8], "rank 0 alone writes the samples"

    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "two", resumed, ignore=shutil.ignore_patterns("final", "step_8"))
    config = write_config(tmp_path, tiny_policy, "resumed", micro=4)
    err = rmkit_sft(capsys, "--config", config, "--resume", *fsdp)
    assert "saved by 2 process(es), this run has 1" in err, err[-2000:]
    assert_close(tmp_path / "two", resumed)
