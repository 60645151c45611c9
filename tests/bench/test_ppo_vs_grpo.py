"""benchmarks/ppo_vs_grpo.py end to end on tiny random models: both recipes run in their own process from the
same start, and the results file holds every validation against generated tokens and seconds, the rise in
step-0 std units, PPO's critic numbers, and the figure."""

import json
from pathlib import Path

import pytest

from benchmarks import ppo_vs_grpo
from tests.recipes.conftest import tiny_reward_model, write_prompts  # noqa: F401 (a fixture)


@pytest.mark.slow  # ~40 s: two training subprocesses, each importing transformers
def test_ppo_vs_grpo_end_to_end(tiny_policy, tiny_reward_model, tmp_path):  # noqa: F811 (the fixture)
    train, val = write_prompts(tmp_path / "train.jsonl", 16), write_prompts(tmp_path / "val.jsonl", 4, offset=100)
    out = tmp_path / "ppo_vs_grpo.json"
    args = ["--policy", tiny_policy, "--reward-model", tiny_reward_model, "--train-data", str(train),
            "--val-data", str(val), "--steps", "2", "--prompts", "2", "--generations", "2", "--max-new-tokens", "4",
            "--val-period", "1", "--val-samples", "4", "--lr", "1e-3", "--threads", "1",
            "--work-dir", str(tmp_path / "work")]
    assert ppo_vs_grpo.main([*args, "--output", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert set(payload["results"]) == {"ppo", "grpo"}
    for recipe, result in payload["results"].items():
        steps = [v["step"] for v in result["validations"]]
        assert steps == [0, 1, 2], recipe
        tokens = [v["generated_tokens"] for v in result["validations"]]
        assert tokens[0] == 0 and tokens[1] > 0 and tokens[2] > tokens[1]
        assert result["validations"][-1]["train_seconds"] > 0 and isinstance(result["rise_in_step0_std"], float)
    assert len(payload["results"]["ppo"]["critic"]["loss"]) == 2 and "critic" not in payload["results"]["grpo"]
    assert Path(payload["figure"]).is_file()

    # one side rerun, the other kept from the first file; a shared setting that differs is refused before any run
    with pytest.raises(SystemExit, match="its steps is '2', this run's '3'"):
        ppo_vs_grpo.main([*args, "--steps", "3", "--recipes", "grpo", "--merge", str(out), "--output",
                          str(tmp_path / "refused.json")])
    merged = tmp_path / "merged.json"
    assert ppo_vs_grpo.main([*args, "--recipes", "grpo", "--merge", str(out), "--output", str(merged)]) == 0
    both = json.loads(merged.read_text())["results"]
    assert both["ppo"] == {**payload["results"]["ppo"], "merged_from": str(out)}
    assert "merged_from" not in both["grpo"] and [v["step"] for v in both["grpo"]["validations"]] == [0, 1, 2]
    assert not (tmp_path / "refused.json").exists()
    # two runs joined without training anything; a recipe found twice is refused
    joined = tmp_path / "joined.json"
    assert ppo_vs_grpo.main([*args, "--recipes", "", "--merge", str(out), "--output", str(joined)]) == 0
    assert json.loads(joined.read_text())["results"]["grpo"] == {**payload["results"]["grpo"], "merged_from": str(out)}
    with pytest.raises(SystemExit, match=f"ppo is taken from {out} already"):
        ppo_vs_grpo.main([*args, "--recipes", "", "--merge", str(out), "--merge", str(merged), "--output",
                          str(tmp_path / "twice.json")])
