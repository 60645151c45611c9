"""`rmkit grpo` killed with SIGKILL mid-run and resumed gives the uninterrupted run's metrics and weights: the
sampling generator, prompt order, optimizer and RNG all come back from the checkpoint."""

import json

import pytest
import torch
from safetensors.torch import load_file

from rmkit import cli
from tests.recipes.conftest import grpo_overrides
from tests.support.runs import kill_at_step, logged_metrics

STEPS = 10
VARYING = ("timing/", "train/generated_tokens_per_s")  # wall-clock numbers differ between runs


def _args(tiny_policy, tiny_reward_model, prompt_files, out):
    train, val = prompt_files
    return [*grpo_overrides(tiny_policy, tiny_reward_model, train, val, out, steps=STEPS),
            "checkpointing.save_period=2", "checkpointing.keep_top_k=null", "grpo.val_period=4", "logger.plots=false",
            "grpo.max_num_epochs=3"]  # 4 steps per epoch: the run crosses epochs


@pytest.mark.slow
def test_sigkill_and_resume_reproduce_the_uninterrupted_run(tiny_policy, tiny_reward_model, prompt_files, tmp_path):
    reference = tmp_path / "reference"
    assert cli.main(["grpo", *_args(tiny_policy, tiny_reward_model, prompt_files, reference)]) == 0

    killed = tmp_path / "killed"
    kill_at_step(["grpo", *_args(tiny_policy, tiny_reward_model, prompt_files, killed)], killed, 5)
    assert (killed / "step_4").is_dir() and not (killed / "final").exists()

    assert cli.main(["grpo", *_args(tiny_policy, tiny_reward_model, prompt_files, killed), "--resume"]) == 0
    assert logged_metrics(killed, VARYING) == logged_metrics(reference, VARYING)
    ref_weights, resumed = load_file(reference / "final" / "model.safetensors"), load_file(killed / "final" / "model.safetensors")
    assert all(torch.equal(ref_weights[k], resumed[k]) for k in ref_weights)
    samples = (killed / "logs" / "samples.jsonl").read_text()  # validation at steps 0, 4, 8 and 10
    assert samples == (reference / "logs" / "samples.jsonl").read_text()
    assert sorted({json.loads(line)["step"] for line in samples.splitlines()}) == [0, 4, 8, 10]
