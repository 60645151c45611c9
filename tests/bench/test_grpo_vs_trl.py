"""benchmarks/grpo_vs_trl.py end to end on tiny random models: both sides train in their own subprocess and
every field of the results file is filled."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from benchmarks import grpo_vs_trl
from tests.bench.test_harness import tiny_bert_reward_model


def numbers(value, path=""):
    """Every leaf of a JSON value, with its path."""
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in numbers(v, f"{path}/{k}")]
    if isinstance(value, list):
        return [leaf for i, v in enumerate(value) for leaf in numbers(v, f"{path}[{i}]")]
    return [(path, value)]


@pytest.mark.slow  # ~60 s: two training subprocesses, each importing transformers (and TRL)
def test_grpo_vs_trl_end_to_end(tiny_policy, shared_data, tmp_path):
    reward_model = tiny_bert_reward_model(tmp_path / "rm")
    out = tmp_path / "grpo_vs_trl.json"
    assert grpo_vs_trl.main(["--policy", tiny_policy, "--reward-model", str(reward_model), "--prompts", "2",
                             "--generations", "2", "--steps", "2", "--max-new-tokens", "4", "--threads", "1",
                             "--eval-prompts", "2", "--lr", "1e-3", "--data-dir", str(shared_data),
                             "--work-dir", str(tmp_path / "work"), "--output", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert [r["side"] for r in payload["runs"]] == ["trl", "rmkit"]
    for run in payload["runs"]:
        assert len(run["steps"]) == 2
        assert all(step[p] >= 0 for step in run["steps"] for p in grpo_vs_trl.PARTS), run["steps"]
        assert all(step["total"] > 0 and step["generation"] > 0 and step["reward_calculation"] > 0
                   and step["training"] > 0 for step in run["steps"])
        assert run["generated_tokens"] > 0 and run["peak_rss_mib"] > 100
    assert set(payload["held_out_reward"]) == {"initial", "trl", "rmkit"}
    assert all(len(h["rewards"]) == 2 for h in payload["held_out_reward"].values())
    assert set(payload["ratio_trl_over_rmkit"]) == set(grpo_vs_trl.PARTS)
    leaves = numbers(payload)
    assert all(v is not None and (not isinstance(v, float) or math.isfinite(v)) for _, v in leaves), \
        [p for p, v in leaves if v is None or (isinstance(v, float) and not math.isfinite(v))]
    assert "| **TRL / rmkit s/step** |" in grpo_vs_trl.markdown_table(payload)
    initial = load_file(tmp_path / "work" / "policy" / "model.safetensors")
    for run in payload["runs"]:  # both sides trained the same policy and saved it
        final = load_file(next(Path(run["model_dir"]).glob("*.safetensors")))
        assert final.keys() == initial.keys() and any(not torch.equal(final[k], initial[k]) for k in initial)
