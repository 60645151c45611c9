"""`rmkit ppo` under SIGKILL and resume (bitwise: the policy, the critic and their optimizer come back), and
`torchrun --nproc-per-node 2` (gloo, CPU; DDP and FSDP2) against one process.

The 2-process comparison follows tests/recipes/test_grpo_ddp.py (read its docstring): `top_k: 1` makes both runs
sample the same completions, one optimizer step per pass over the rollout keeps the mini-batches the same
rows. GAE is per completion, and its whitening over the tokens of every rank is what a per-rank whitening
would get wrong from step 1 on.
"""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rmkit import cli
from tests.recipes.conftest import ppo_overrides
from tests.recipes.test_grpo_ddp import generations, records
from tests.support.launch import CHILD_ENV, torchrun
from tests.support.runs import kill_at_step, logged_metrics

STEPS = 6
VARYING = ("timing/", "train/generated_tokens_per_s")


def _resume_args(tiny_policy, tiny_reward_model, prompt_files, out):
    train, val = prompt_files
    return [*ppo_overrides(tiny_policy, tiny_reward_model, train, val, out, steps=STEPS), "checkpointing.save_period=2",
            "checkpointing.keep_top_k=null", "ppo.val_period=3", "logger.plots=false", "ppo.max_num_epochs=2",
            "ppo.kl_target=0.001", "ppo.policy_training_start_step=1",  # the KL coefficient moves, warmup passes
            "ppo.shuffle_minibatches=true"]  # each epoch's order is drawn again on resume


def _metrics(out: Path) -> list[dict]:
    return logged_metrics(out, VARYING)


@pytest.mark.slow
def test_sigkill_and_resume_reproduce_the_uninterrupted_run(tiny_policy, tiny_reward_model, prompt_files, tmp_path):
    reference = tmp_path / "reference"
    assert cli.main(["ppo", *_resume_args(tiny_policy, tiny_reward_model, prompt_files, reference)]) == 0

    killed = tmp_path / "killed"
    kill_at_step(["ppo", *_resume_args(tiny_policy, tiny_reward_model, prompt_files, killed)], killed, 3)
    assert (killed / "step_2").is_dir() and not (killed / "final").exists()

    assert cli.main(["ppo", *_resume_args(tiny_policy, tiny_reward_model, prompt_files, killed), "--resume"]) == 0
    assert _metrics(killed) == _metrics(reference)
    coefficients = [r["train/kl_coefficient"] for r in _metrics(reference) if "train/kl_coefficient" in r]
    assert len(set(coefficients)) > 2  # the adaptive coefficient moved, and came back on resume
    for part in ("model.safetensors", "critic/model.safetensors"):
        ref_weights, resumed = load_file(reference / "final" / part), load_file(killed / "final" / part)
        assert all(torch.equal(ref_weights[k], resumed[k]) for k in ref_weights), part


DETERMINISTIC = ["policy.generation.top_k=1", "loss_fn.reference_policy_kl_penalty=0.05", "logger.plots=false",
                 "checkpointing.save_period=0", "policy.train_global_batch_size=8", "policy.train_micro_batch_size=4",
                 "value.train_micro_batch_size=4"]
# 1 - Var(R - V) / Var(R) from sums of squares of returns near 0: a difference of nearly equal numbers, which
# turns the runs' float32 rounding differences into ~1e-4 relative.
CANCELLING = {"train/critic/explained_var": 1e-3}
PARALLEL = {"ddp": [], "fsdp2": ["policy.dtensor_cfg.enabled=true", "ppo.max_val_samples=3"]}


@pytest.mark.slow
@pytest.mark.parametrize("parallel", PARALLEL)
def test_two_gloo_processes_equal_one_process(tiny_policy, tiny_reward_model, prompt_files, tmp_path, parallel):
    train, val = prompt_files
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    base = ppo_overrides(tiny_policy, tiny_reward_model, train, val, single, steps=3) + DETERMINISTIC + PARALLEL[parallel]
    assert cli.main(["ppo", *base]) == 0
    args = [a for a in base if not a.startswith("checkpointing.checkpoint_dir=")]
    err = torchrun(["-m", "rmkit", "ppo", *args, f"checkpointing.checkpoint_dir={ddp}", "policy.train_micro_batch_size=2",
                    "value.train_micro_batch_size=2"], CHILD_ENV)  # per rank: 4 of the global 8, 2 micro-batches
    assert err.count("rmkit: PPO on") == 1, "only rank 0 prints"

    assert generations(ddp) == generations(single)
    a, b = records(single), records(ddp)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2, 3, 3]
    assert a[1]["train/critic/loss"] > 0 and a[1]["train/advantages/max"] > 0
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        mismatched = [(ra["step"], key, ra[key], rb[key]) for key in ra
                      if rb[key] != pytest.approx(ra[key], rel=CANCELLING.get(key, 1e-4), abs=1e-5)]
        assert not mismatched
    for part, initial in (("model.safetensors", Path(tiny_policy) / "model.safetensors"),
                          ("critic/model.safetensors", Path(tiny_reward_model) / "model.safetensors")):
        w1, w2 = load_file(single / "final" / part), load_file(ddp / "final" / part)
        start = load_file(initial)
        assert any(not torch.equal(w1[k], start[k]) for k in start), part
        for key in w1:
            torch.testing.assert_close(w2[key], w1[key], rtol=0, atol=1e-4)
