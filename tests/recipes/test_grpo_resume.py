"""`rmkit grpo` killed with SIGKILL mid-run and resumed gives the uninterrupted run's metrics and weights: the
sampling generator, prompt order, optimizer and RNG all come back from the checkpoint."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rmkit import cli
from tests.recipes.conftest import grpo_overrides

REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS = 10
VARYING = ("timing/", "train/generated_tokens_per_s")  # wall-clock numbers differ between runs


def _args(tiny_policy, tiny_reward_model, prompt_files, out):
    train, val = prompt_files
    return [*grpo_overrides(tiny_policy, tiny_reward_model, train, val, out, steps=STEPS),
            "checkpointing.save_period=2", "checkpointing.keep_top_k=null", "grpo.val_period=4", "logger.plots=false",
            "grpo.max_num_epochs=3"]  # 4 steps per epoch: the run crosses epochs


def _metrics(out: Path) -> list[dict]:
    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VARYING)} for r in records]


def _logged_step(out: Path) -> int:
    try:
        lines = (out / "logs" / "metrics.jsonl").read_text().splitlines()[:-1]
    except FileNotFoundError:
        return 0
    return max((json.loads(line)["step"] for line in lines), default=0)


@pytest.mark.slow
def test_sigkill_and_resume_reproduce_the_uninterrupted_run(tiny_policy, tiny_reward_model, prompt_files, tmp_path):
    reference = tmp_path / "reference"
    assert cli.main(["grpo", *_args(tiny_policy, tiny_reward_model, prompt_files, reference)]) == 0

    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "rmkit", "grpo", *_args(tiny_policy, tiny_reward_model,
                             prompt_files, killed)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while _logged_step(killed) < 5 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-3000:]
    assert (killed / "step_4").is_dir() and not (killed / "final").exists()

    assert cli.main(["grpo", *_args(tiny_policy, tiny_reward_model, prompt_files, killed), "--resume"]) == 0
    assert _metrics(killed) == _metrics(reference)
    ref_weights, resumed = load_file(reference / "final" / "model.safetensors"), load_file(killed / "final" / "model.safetensors")
    assert all(torch.equal(ref_weights[k], resumed[k]) for k in ref_weights)
    samples = (killed / "logs" / "samples.jsonl").read_text()  # validation at steps 0, 4, 8 and 10
    assert samples == (reference / "logs" / "samples.jsonl").read_text()
    assert sorted({json.loads(line)["step"] for line in samples.splitlines()}) == [0, 4, 8, 10]
