"""benchmarks/dpo_quality.py end to end on tiny random models: every variant really trains through the
`rmkit dpo` CLI, is scored on the dev split, the choice follows the stated rule, and `--final` scores the
chosen policy on hh_harmless_val and its greedy answers with a reward model."""

import json
import math

import pytest

from benchmarks import dpo_quality
from tests.bench.test_harness import tiny_bert_reward_model


@pytest.mark.slow  # ~1 min: two `rmkit dpo` subprocesses and 600 scored sequences
def test_dpo_quality_end_to_end(tiny_policy, shared_data, tmp_path):
    out = tmp_path / "dpo_quality.json"
    variants = ("slow:policy.train_global_batch_size=4,"
                "fast:policy.train_global_batch_size=4+policy.optimizer.lr=1e-3+dpo.max_num_epochs=2")
    argv = ["--policy", tiny_policy, "--reward-model", str(tiny_bert_reward_model(tmp_path / "rm")),
            "--variants", variants, "--train-pairs", "8", "--dev-pairs", "6", "--warmup-steps", "0", "--prompts", "3",
            "--max-new-tokens", "4", "--threads", "1", "--final", "--data-dir", str(shared_data),
            "--work-dir", str(tmp_path / "work"), "--output", str(out)]
    assert dpo_quality.main(argv) == 0
    payload = json.loads(out.read_text())
    runs = {r["variant"]: r for r in payload["runs"]}
    assert list(runs) == ["slow", "fast"]
    # 8 pairs, 4 per step: one epoch is 2 steps; a variant's dpo.max_num_epochs wins over the study's one epoch
    assert runs["slow"]["steps"] == 2 and runs["fast"]["steps"] == 4
    for run in runs.values():
        assert math.isfinite(run["final_train_loss"])
        assert len(run["dev_correct"]) == 6 and math.isclose(run["dev_accuracy"], sum(run["dev_correct"]) / 6, rel_tol=1e-6)
    assert runs["fast"]["lr"] == 1e-3 and runs["slow"]["lr"] == 5e-6
    assert abs(runs["fast"]["dev_margin_mean"]) > abs(runs["slow"]["dev_margin_mean"])  # lr 1e-3 moved it further
    assert runs["slow"]["vs_first"]["mean_difference"] == 0
    best = max(r["dev_accuracy"] for r in runs.values())
    assert payload["chosen"] == next(label for label, r in runs.items() if r["dev_accuracy"] == best)
    final = payload["final"]
    assert final["variant"] == payload["chosen"] and final["pairs"] == 300 and 0 <= final["accuracy"] <= 1
    assert final["prompts"] == 3 and len(final["samples"]) == 3
    assert all(math.isfinite(final[k]) for k in ("reward_before", "reward_after", "reward_difference"))
    # A second invocation over the same work dir reuses the finished runs and their dev scores.
    assert dpo_quality.main(argv) == 0
    assert json.loads(out.read_text())["runs"] == payload["runs"]
