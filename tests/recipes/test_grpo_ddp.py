"""`torchrun --nproc-per-node 2 -m rmkit grpo` (gloo, CPU; DDP and FSDP2) against one process.

Rollouts are sampled per rank from per-rank generators, so a 2-process run is in general not the computation
of a 1-process run. Here the sampling is made independent of the generators: `top_k: 1` draws the argmax at
every position (the log-probs are still those of the full distribution at the temperature), so both runs
generate the same completions for the same prompts, and the sampler gives rank r the r-th half of each
global prompt batch, which the single process holds in the same order. Greedy completions of one prompt
are all equal, so GRPO's group advantages would be 0; the test uses Reinforce++ without the group baseline,
whose advantages are the rewards whitened over the batch: with per-rank instead of global whitening
(the bug this test was written against) the 2-process advantages, and so the updates, differ at step 1.

One optimizer step per rollout (`train_global_batch_size` = the rollout's 8 completions): with several, the
single process's first mini-batch holds the first prompts of the global batch, while under DDP it holds the
first prompts of each rank's share (other prompts: a different but equally valid split of the rollout).

Tolerances: both runs add the same contributions in a different order (per-rank sums then an all-reduce,
rows generated and scored in batches of other widths) and agree to float32 rounding, which Adam's
normalization amplifies on near-zero gradients over the steps: metrics to 1e-4 relative (plus 1e-5 absolute
for means near zero), weights to 1e-4 absolute; completions exactly (an argmax flip would change a
completion, and the test would show it, not hide it).
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rmkit import cli
from tests.recipes.conftest import grpo_overrides
from tests.support.launch import CHILD_ENV, torchrun

DETERMINISTIC = ["policy.generation.top_k=1", "grpo.adv_estimator.name=reinforce_plus_plus",
                 "grpo.adv_estimator.minus_baseline=false", "loss_fn.reference_policy_kl_penalty=0.05",
                 "logger.plots=false", "checkpointing.save_period=0", "policy.train_global_batch_size=8",
                 "policy.train_micro_batch_size=4"]


def records(out: Path) -> list[dict]:
    lines = (out / "logs" / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("timing/") and not k.endswith("_per_s")}
            for line in lines]


def generations(out: Path) -> dict[int, list[str]]:
    """The validation completions of `samples.jsonl`, by step."""
    by_step: dict[int, list[str]] = {}
    for line in (out / "logs" / "samples.jsonl").read_text().splitlines():
        sample = json.loads(line)
        by_step.setdefault(sample["step"], []).append(sample["completion"])
    return by_step


# FSDP2: the policy and the frozen reference sharded; 3 validation prompts split 1 / 2 over the ranks, so
# rank 0 generates for a repeated prompt too (FSDP2 forwards all-gather) and drops it.
PARALLEL = {"ddp": [], "fsdp2": ["policy.dtensor_cfg.enabled=true", "grpo.max_val_samples=3"]}


@pytest.mark.slow  # ~40 s on a busy 2-core machine (one torchrun launch importing transformers twice)
@pytest.mark.parametrize("parallel", PARALLEL)
def test_two_gloo_processes_equal_one_process(tiny_policy, tiny_reward_model, prompt_files, tmp_path, parallel):
    train, val = prompt_files
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    base = grpo_overrides(tiny_policy, tiny_reward_model, train, val, single, steps=3) + DETERMINISTIC + PARALLEL[parallel]
    assert cli.main(["grpo", *base]) == 0
    args = [a for a in base if not a.startswith("checkpointing.checkpoint_dir=")]
    err = torchrun(["-m", "rmkit", "grpo", *args, f"checkpointing.checkpoint_dir={ddp}",
                    "policy.train_micro_batch_size=2"], CHILD_ENV)  # per rank: 4 of the global 8, in 2 micro-batches
    assert err.count("rmkit: GRPO on") == 1, "only rank 0 prints"

    val_prompts = 3 if parallel == "fsdp2" else 4
    assert generations(ddp) == generations(single) and len(generations(single)[0]) == val_prompts
    a, b = records(single), records(ddp)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2, 3, 3]
    assert a[1]["train/reward_std"] > 0 and a[1]["train/advantages/max"] > 0  # there is something to learn
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for key in ra:
            assert rb[key] == pytest.approx(ra[key], rel=1e-4, abs=1e-5), (ra["step"], key)
    w1, w2 = load_file(single / "final" / "model.safetensors"), load_file(ddp / "final" / "model.safetensors")
    initial = load_file(Path(tiny_policy) / "model.safetensors")
    assert any(not torch.equal(w1[k], initial[k]) for k in initial)
    for key in w1:
        torch.testing.assert_close(w2[key], w1[key], rtol=0, atol=1e-4)


@pytest.mark.slow  # ~25 s
def test_nan_reward_on_one_rank_stops_every_rank(tiny_policy, tiny_reward_model, prompt_files, tmp_path):
    train, val = prompt_files
    args = grpo_overrides(tiny_policy, tiny_reward_model, train, val, tmp_path / "run") + ["grpo.val_at_start=false"]
    err = torchrun(["-m", "tests.recipes._grpo_nan_worker", "grpo", *args], CHILD_ENV, timeout=150, returncode=1)
    # Rank 1 names its prompt; rank 0, whose rewards were fine, stops too instead of waiting for rank 1.
    assert err.count("rmkit grpo: stopped: the reward model returned nan for a completion of the prompt at") == 1
    assert err.count("rmkit grpo: stopped: (in another process) the reward model returned nan") == 1
    assert not (tmp_path / "run" / "final").exists()
